// Command xpu lists devices, runs the conformance suite, generates text and benchmarks
// backends. Each subcommand lives in its own file and registers itself in init.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"sort"
	"strings"

	// the backends built into xpu (the reference and Core ML) register themselves
	_ "github.com/xpuhub/xpu/plugins/builtin"
)

// command is one subcommand. run returns the process exit status.
type command struct {
	name    string
	summary string
	hidden  bool
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

var commands = map[string]*command{}

func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("xpu: duplicate subcommand " + c.name)
	}
	commands[c.name] = c
}

// parseFlags parses a subcommand's flags. When parsing ends the command (ok false), code is its
// exit status: 0 for -h (asking for help is not an error), 2 for a bad flag, which fs has
// already explained.
func parseFlags(fs *flag.FlagSet, args []string) (code int, ok bool) {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		return 0, false
	}
	return 2, false
}

// parseInterspersed is parseFlags for commands that take positional arguments (a model path)
// among their flags, as llama.cpp's tools do: `xpu run model.gguf -n 16` and `xpu run -n 16
// model.gguf` mean the same. Everything after "--" is positional. fs.Args() holds the
// positional arguments afterwards.
func parseInterspersed(fs *flag.FlagSet, args []string) (code int, ok bool) {
	var pos []string
	for {
		if code, ok := parseFlags(fs, args); !ok {
			return code, false
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
	// Parse leaves the flags already set alone: this only resets fs.Args.
	if err := fs.Parse(append([]string{"--"}, pos...)); err != nil {
		return 2, false
	}
	return 0, true
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: xpu <command> [flags]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n, c := range commands {
		if !c.hidden {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'xpu <command> -h' for a command's flags, 'xpu --version' for the version.")
	fmt.Fprintln(w, "XPU_LOG=debug shows the loader's work.")
}

// commit is set by the Makefile (-ldflags -X main.commit=...) for builds where the toolchain
// records no VCS information (-buildvcs=false, a git worktree it does not stamp).
var commit string

// version is the module version and the commit the binary was built from, as the Go
// toolchain recorded them ("(devel)" for a build inside the repository; the commit is there
// when it was built from a git checkout).
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "xpu (no build information)"
	}
	if commit != "" && !slices.ContainsFunc(bi.Settings, func(s debug.BuildSetting) bool { return s.Key == "vcs.revision" }) {
		bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs.revision", Value: commit})
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	out := fmt.Sprintf("xpu %s %s", v, bi.GoVersion)
	if rev := settings["vcs.revision"]; rev != "" {
		out += " commit " + rev
		if settings["vcs.modified"] == "true" {
			out += " (modified)"
		}
		if t := settings["vcs.time"]; t != "" {
			out += " " + t
		}
	}
	return out
}

func main() {
	if len(os.Args) > 1 {
		startCrashMonitor(os.Args[1])
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	level := slog.LevelWarn
	switch strings.ToLower(os.Getenv("XPU_LOG")) {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})))

	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" || args[0] == "version" {
		fmt.Fprintln(stdout, version())
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "xpu: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	return c.run(ctx, args[1:], stdout, stderr)
}

// modelFlags starts the flag set of a command that reads one model: --model (-m), or the
// argument (parseModelArgs).
func modelFlags(name, help string, stderr io.Writer) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	model := fs.String("model", "", help+" (or give it as the argument)")
	fs.StringVar(model, "m", "", "alias of --model")
	return fs, model
}

// parseModelArgs parses args (flags anywhere) and takes the model from the argument when
// --model is not given; without exactly one model it prints the usage. ok false: exit with code.
func parseModelArgs(fs *flag.FlagSet, args []string, model *string) (code int, ok bool) {
	if code, ok := parseInterspersed(fs, args); !ok {
		return code, false
	}
	if !modelArg(fs, model) {
		fs.Usage()
		return 2, false
	}
	return 0, true
}

// modelArg takes a command's model from --model or its one positional argument (llama.cpp's
// habit); false when there is none, or both, or more arguments.
func modelArg(fs *flag.FlagSet, model *string) bool {
	if *model == "" && fs.NArg() == 1 {
		*model = fs.Arg(0)
		return true
	}
	return fs.NArg() == 0 && *model != ""
}

// setUsage makes fs print lines, then its flags' defaults, when it asks for its usage.
func setUsage(fs *flag.FlagSet, stderr io.Writer, lines ...string) {
	fs.Usage = func() {
		for _, l := range lines {
			fmt.Fprintln(stderr, l)
		}
		fs.PrintDefaults()
	}
}

// usageExit gives a command's usage-error exit: it prints the message (format and a, as
// fmt.Fprintf, ending the line) and returns exit code 2.
func usageExit(stderr io.Writer, format string, a ...any) int {
	fmt.Fprintf(stderr, format+"\n", a...)
	return 2
}

// failer gives a command's error exit: it prints err after the command's name ("xpu run: ...")
// and returns exit code 1.
func failer(stderr io.Writer, name string) func(error) int {
	return func(err error) int {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
}
