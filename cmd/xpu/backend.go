package main

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"

	"github.com/xpuhub/xpu/loader"
)

func init() {
	register(&command{name: "backend", summary: "write the skeleton of a new backend plugin (backend new NAME [DIR])", run: runBackend})
}

// backendTemplates are the files `xpu backend new` writes, embedded so that the binary alone
// is the kit: a vendor needs no checkout of this repository beyond the installed SDK.
//
//go:embed backendtmpl/*.tmpl
var backendTemplates embed.FS

// backendName is what a backend name may be: it becomes C identifiers (a macro prefix), the
// file names NAME.c and libxpu-NAME.so and the probe's name, which holds 31 bytes.
var backendName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,30}$`)

// ErrBadBackendName is returned for a NAME that is no C identifier, is too long or is reserved.
var ErrBadBackendName = errors.New("bad backend name")

// ErrDirNotEmpty is returned when the skeleton's folder already holds files (and --force was not given).
var ErrDirNotEmpty = errors.New("folder is not empty")

// skeletonFile is one file of the skeleton: the template it comes from and the name it gets.
type skeletonFile struct{ tmpl, name string }

func skeletonFiles(name string) []skeletonFile {
	return []skeletonFile{
		{"backend.c.tmpl", name + ".c"},
		{"Makefile.tmpl", "Makefile"},
		{"README.md.tmpl", "README.md"},
	}
}

// checkBackendName says why name cannot name a backend (nil when it can).
func checkBackendName(name string) error {
	if !backendName.MatchString(name) {
		return fmt.Errorf("%q: a backend name is a C identifier of 1 to 31 characters, starting with a letter: %w",
			name, ErrBadBackendName)
	}
	if strings.EqualFold(name, loader.RefName) {
		return fmt.Errorf("%q is the built-in reference backend's name: %w", name, ErrBadBackendName)
	}
	return nil
}

// writeSkeleton writes the skeleton of backend name into dir (created if missing) and returns
// the paths it wrote. A folder that holds anything is refused unless force, which overwrites
// the skeleton's own files and leaves every other file alone.
func writeSkeleton(name, dir string, force bool) ([]string, error) {
	if err := checkBackendName(name); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("backend new: %w", err)
	case len(entries) > 0 && !force:
		return nil, fmt.Errorf("backend new: %s: %w (give --force to overwrite the skeleton's files there)", dir, ErrDirNotEmpty)
	}
	data := struct{ Name, Upper string }{Name: name, Upper: strings.ToUpper(name)}
	// render everything before writing anything, so a template error leaves no half skeleton
	var out [][]byte
	files := skeletonFiles(name)
	for _, f := range files {
		t, err := template.New(f.tmpl).Option("missingkey=error").ParseFS(backendTemplates, "backendtmpl/"+f.tmpl)
		if err != nil {
			return nil, fmt.Errorf("backend new: template %s: %w", f.tmpl, err)
		}
		var b bytes.Buffer
		if err := t.Execute(&b, data); err != nil {
			return nil, fmt.Errorf("backend new: template %s: %w", f.tmpl, err)
		}
		out = append(out, b.Bytes())
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("backend new: %w", err)
	}
	var written []string
	for i, f := range files {
		p := filepath.Join(dir, f.name)
		if err := os.WriteFile(p, out[i], 0o644); err != nil {
			return written, fmt.Errorf("backend new: %w", err)
		}
		written = append(written, p)
	}
	return written, nil
}

func runBackend(_ context.Context, args []string, stdout, stderr io.Writer) int {
	usageLine := "usage: xpu backend new [--force] NAME [DIR]"
	if len(args) == 0 || args[0] != "new" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(stdout, usageLine)
			return 0
		}
		fmt.Fprintln(stderr, usageLine)
		return 2
	}
	fs := flag.NewFlagSet("backend new", flag.ContinueOnError)
	fs.SetOutput(stderr)
	force := fs.Bool("force", false, "write into a folder that is not empty (overwrites the skeleton's files there)")
	setUsage(fs, stderr,
		usageLine,
		"Writes NAME.c (every ABI entry; ADD on f32 implemented, every other op refused with a reason), a Makefile that builds libxpu-NAME.so against an installed SDK (make install-sdk PREFIX=...; pkg-config xpu-backend) and a README. DIR defaults to ./NAME.",
	)
	if code, ok := parseInterspersed(fs, args[1:]); !ok {
		return code
	}
	if fs.NArg() < 1 || fs.NArg() > 2 {
		fs.Usage()
		return 2
	}
	name, dir := fs.Arg(0), fs.Arg(0)
	if fs.NArg() == 2 {
		dir = fs.Arg(1)
	}
	written, err := writeSkeleton(name, dir, *force)
	if err != nil {
		fmt.Fprintf(stderr, "xpu %v\n", err)
		if errors.Is(err, ErrBadBackendName) || errors.Is(err, ErrDirNotEmpty) {
			return 2
		}
		return 1
	}
	for _, p := range written {
		fmt.Fprintf(stdout, "wrote %s\n", p)
	}
	fmt.Fprintf(stdout, "next: make -C %s (needs the SDK: make install-sdk PREFIX=... in the xpu repository), then xpu conform --plugin %s\n",
		dir, filepath.Join(dir, "libxpu-"+name+".so"))
	return 0
}
