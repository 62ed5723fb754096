package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/conformance"
	"github.com/xpuhub/xpu/loader/plugintest"
)

// abiEntries lists the function-table entries of abi/xpu_backend.h, in order.
func abiEntries(t *testing.T) []string {
	t.Helper()
	h, err := os.ReadFile(filepath.Join(plugintest.Root(), "abi", "xpu_backend.h"))
	require.NoError(t, err)
	_, table, ok := strings.Cut(string(h), "typedef struct xpu_api {")
	require.True(t, ok, "no xpu_api in the header")
	table, _, ok = strings.Cut(table, "} xpu_api;")
	require.True(t, ok)
	var names []string
	for _, m := range regexp.MustCompile(`\(\*(\w+)\)\(`).FindAllStringSubmatch(table, -1) {
		names = append(names, m[1])
	}
	require.NotEmpty(t, names)
	return names
}

func TestBackendNew(t *testing.T) {
	tests := []struct {
		name   string
		args   []string // after "backend"
		prep   func(t *testing.T, dir string)
		rc     int
		errOut string
	}{
		{"default folder", []string{"new", "acme"}, nil, 0, ""},
		{"named folder", []string{"new", "Acme_2", "out/x"}, nil, 0, ""},
		{"flag after the arguments", []string{"new", "acme", "--force"}, nil, 0, ""},
		{"not an identifier", []string{"new", "a-b"}, nil, 2, "C identifier"},
		{"a path", []string{"new", "../acme"}, nil, 2, "C identifier"},
		{"leading digit", []string{"new", "9acme"}, nil, 2, "C identifier"},
		{"too long", []string{"new", strings.Repeat("a", 32)}, nil, 2, "1 to 31"},
		{"the reference's name", []string{"new", "ref"}, nil, 2, "reference"},
		{"no name", []string{"new"}, nil, 2, "usage"},
		{"three arguments", []string{"new", "a", "b", "c"}, nil, 2, "usage"},
		{"no subcommand", nil, nil, 2, "usage"},
		{"unknown subcommand", []string{"delete", "acme"}, nil, 2, "usage"},
		{"folder not empty", []string{"new", "acme"}, func(t *testing.T, dir string) {
			require.NoError(t, os.MkdirAll(filepath.Join(dir, "acme"), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "acme", "notes.txt"), []byte("mine"), 0o644))
		}, 2, "not empty"},
		{"folder is a file", []string{"new", "acme", "f"}, func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644))
		}, 1, "f"},
	}
	entries := abiEntries(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Chdir(dir)
			if tt.prep != nil {
				tt.prep(t, dir)
			}
			code, out, errOut := runCLI(t, append([]string{"backend"}, tt.args...)...)
			require.Equal(t, tt.rc, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
			if tt.rc != 0 {
				assert.Contains(t, errOut, tt.errOut)
				return
			}
			name, folder := tt.args[1], tt.args[1]
			if len(tt.args) > 2 && tt.args[2] != "--force" {
				folder = tt.args[2]
			}
			for _, f := range []string{name + ".c", "Makefile", "README.md"} {
				b, err := os.ReadFile(filepath.Join(dir, folder, f))
				require.NoError(t, err, f)
				assert.NotContains(t, string(b), "{{", "%s: a template action left", f)
				assert.NotContains(t, string(b), "<no value>", f)
				assert.Contains(t, string(b), name, f)
				assert.Contains(t, out, filepath.Join(folder, f))
			}
			c, err := os.ReadFile(filepath.Join(dir, folder, name+".c"))
			require.NoError(t, err)
			for _, e := range entries {
				assert.Contains(t, string(c), "be_"+e+",", "the skeleton's table lacks %s", e)
			}
		})
	}
}

// --force writes the skeleton's files into a folder that has others, and leaves those alone.
func TestBackendNewForce(t *testing.T) {
	dir := t.TempDir()
	notes := filepath.Join(dir, "notes.txt")
	require.NoError(t, os.WriteFile(notes, []byte("mine"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "Makefile"), []byte("old"), 0o644))
	code, _, errOut := runCLI(t, "backend", "new", "--force", "acme", dir)
	require.Equal(t, 0, code, errOut)
	b, err := os.ReadFile(notes)
	require.NoError(t, err)
	assert.Equal(t, "mine", string(b))
	mk, err := os.ReadFile(filepath.Join(dir, "Makefile"))
	require.NoError(t, err)
	assert.Contains(t, string(mk), "libxpu-$(NAME).so")
}

// guideCommands are the shell lines of docs/writing-a-backend.md, in order: each is one step
// TestBackendKitOutOfTree runs (with its own prefix, and neon's path added to XPU_PLUGIN_PATH
// because the test binary has no plugins folder beside it).
var guideCommands = []string{
	"make install-sdk PREFIX=$HOME/.local",
	"PKG_CONFIG_PATH=$HOME/.local/lib/pkgconfig pkg-config --cflags xpu-backend",
	"xpu backend new acme",
	"cd acme && PKG_CONFIG_PATH=$HOME/.local/lib/pkgconfig make",
	"xpu conform --plugin ./libxpu-acme.so",
	"xpu devices -v",
	"XPU_PLUGIN_PATH=$PWD xpu run -m stories260K.gguf --temp 0 -n 256 --units acme,neon --stats",
}

// The guide shows exactly the commands the out-of-tree test runs: editing one without the
// other fails here.
func TestWritingABackendCommands(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(plugintest.Root(), "docs", "writing-a-backend.md"))
	require.NoError(t, err)
	var got []string
	in := false
	for _, l := range strings.Split(string(doc), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "```sh":
			in = true
		case l == "```":
			in = false
		case in && l != "":
			got = append(got, l)
		}
	}
	assert.Equal(t, guideCommands, got)
	assert.Contains(t, string(doc), "TestBackendKitOutOfTree", "the guide names the test that runs its commands")
}

// TestBackendKitOutOfTree is the vendor's path from an empty folder, each step as
// docs/writing-a-backend.md shows it: install the SDK, write the skeleton, build it against the
// SDK alone (pkg-config), run the suite on it (ADD passes, everything else is unsupported with
// a reason, nothing fails), then run stories260K across the new backend and neon with no plan
// file: the text is the published greedy sample and the new backend ran the ADD nodes.
func TestBackendKitOutOfTree(t *testing.T) {
	if testing.Short() {
		t.Skip("installs the SDK, builds a plugin and runs the suite: not in -short")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the skeleton's Makefile builds a Linux shared library")
	}
	for _, tool := range []string{"make", "pkg-config", "cc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found (scripts/deps.sh installs it): %v", tool, err)
		}
	}
	root := plugintest.Root()
	work := t.TempDir()
	prefix := filepath.Join(work, "sdk")
	// the model and neon are found before leaving the repository
	model, _ := filepath.Abs(filepath.Join("..", "..", "..", "shared", "models", "stories260K.gguf"))
	neon := filepath.Join(root, "build", "plugins", "libxpu-neon.so")

	// 1. make install-sdk PREFIX=...
	sh := func(dir string, env []string, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		// as from a shell: not the variables of a `make test` this test may run under, which
		// would pass its command-line settings on to the skeleton's make
		for _, kv := range os.Environ() {
			if k, _, _ := strings.Cut(kv, "="); k != "MAKEFLAGS" && k != "MFLAGS" && k != "MAKELEVEL" {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, env...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
		return string(out)
	}
	sh(root, nil, "make", "--no-print-directory", "install-sdk", "PREFIX="+prefix)
	for _, h := range []string{"xpu_backend.h", "xpu_ir.h", "xpu_plugin.h", "xpu_sync.h"} {
		assert.FileExists(t, filepath.Join(prefix, "include", "xpu", h))
	}
	pcPath := "PKG_CONFIG_PATH=" + filepath.Join(prefix, "lib", "pkgconfig")
	cflags := sh(work, []string{pcPath}, "pkg-config", "--cflags", "xpu-backend")
	assert.Equal(t, "-I"+filepath.Join(prefix, "include", "xpu"), strings.TrimSpace(cflags))

	// 2. xpu backend new acme, from an empty folder
	t.Chdir(work)
	code, out, errOut := runCLI(t, "backend", "new", "acme")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	acme := filepath.Join(work, "acme")

	// 3. make, against the installed SDK only
	build := sh(acme, []string{pcPath}, "make")
	for _, flag := range []string{"-std=c11", "-Wall", "-Wextra", "-Werror", "-I" + filepath.Join(prefix, "include", "xpu")} {
		assert.Contains(t, build, flag)
	}
	require.FileExists(t, filepath.Join(acme, "libxpu-acme.so"))

	// 4. xpu conform --plugin ./libxpu-acme.so
	t.Chdir(acme)
	code, out, errOut = runCLI(t, "conform", "--plugin", "./libxpu-acme.so")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	var rep conformance.Report
	b, err := os.ReadFile(filepath.Join(acme, "build", "conformance", "acme.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &rep))
	assert.Positive(t, rep.Passed)
	assert.Zero(t, rep.Failed, "failures: %v", rep.Failures())
	assert.Positive(t, rep.Unsupported)
	for _, c := range rep.Cases {
		if c.Status == conformance.StatusUnsupported {
			assert.NotEmpty(t, c.Reason, "%s is unsupported without a reason", c.Name)
		}
		if c.Status == conformance.StatusPass && c.Level == 2 {
			assert.Equal(t, "ADD", c.Op, "%s passed, but the skeleton runs only ADD", c.Name)
		}
	}
	claimed := map[string]bool{}
	for _, l := range rep.Levels {
		claimed[l.Name] = l.Claimed
	}
	assert.Equal(t, map[string]bool{conformance.LevelABI: true, conformance.LevelLLMOps: false,
		conformance.LevelLLM: false, conformance.LevelHeterogeneous: true}, claimed)
	assert.Contains(t, out, "== level ABI: claimed")

	// 5. xpu run --units acme,neon: ADD on acme, the rest on neon, no plan file
	t.Run("run beside neon", func(t *testing.T) {
		if _, err := os.Stat(model); err != nil {
			t.Skipf("test model absent: %v", err)
		}
		if _, err := os.Stat(neon); err != nil {
			t.Skipf("neon is not built (make all): %v", err)
		}
		want, err := os.ReadFile(filepath.Join(filepath.Dir(model), "stories260K.greedy.txt"))
		require.NoError(t, err)
		t.Setenv("XPU_PLUGIN_PATH", acme+string(os.PathListSeparator)+neon)
		code, out, errOut := runCLI(t, "devices", "-v")
		require.Equal(t, 0, code, errOut)
		assert.Regexp(t, `(?m)^acme +0: acme device +acme:0 +accel +10 `, out)
		code, out, errOut = runCLI(t, "run", "-m", model, "--temp", "0", "-n", "256", "--units", "acme,neon", "--stats")
		require.Equal(t, 0, code, errOut)
		assert.Equal(t, string(want), out)
		// the placement report: one line per unit and phase, "acme:0   ADD×10"
		lines := regexp.MustCompile(`(?m)^  acme:0 +(\S+×.*)$`).FindAllStringSubmatch(errOut, -1)
		require.Len(t, lines, 2, "acme in the prefill and decode placement:\n%s", errOut)
		for _, l := range lines {
			m := regexp.MustCompile(`^ADD×(\d+)$`).FindStringSubmatch(strings.TrimSpace(l[1]))
			require.NotNil(t, m, "acme runs only ADD, got %q", l[1])
			n, _ := strconv.Atoi(m[1])
			assert.Positive(t, n)
		}
		assert.Regexp(t, `(?m)^  neon:0 +.*MATMUL×\d+`, errOut)
		assert.Regexp(t, `acme:0 +arena by host pointer +[1-9]\d* tasks`, errOut, "acme ran tasks from the shared arena")
		assert.Contains(t, errOut, " 0 copies")
	})
}
