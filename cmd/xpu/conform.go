package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/xpuhub/xpu/conformance"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/loader"
)

func init() {
	register(&command{name: "conform", summary: "run the conformance suite on backends", run: runConform})
}

// defaultReportDir is where reports go unless --report says otherwise: beside the other build
// outputs, where `make test` keeps them.
const defaultReportDir = "build/conformance"

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func runConform(ctx context.Context, args []string, stdout, stderr io.Writer) (code int) {
	fs := flag.NewFlagSet("conform", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var plugins stringList
	fs.Var(&plugins, "plugin", "backend name or plugin file to test (repeatable)")
	all := fs.Bool("all", false, "test every backend discovery finds with a probe score > 0 (not ref)")
	device := fs.Int("device", 0, "device index")
	filter := fs.String("filter", "", "run only the cases whose name matches this regular expression")
	isolated := fs.Bool("isolated", false, "load plugins in a child process, so a crash fails a case instead of the run")
	validate := fs.Bool("validate", false, "check every plugin ABI call the suite makes against the ABI's rules (the validation layer)")
	timeout := fs.Duration("timeout", 0, "with --isolated, deadline of one execute; a plugin still running then is killed (0 = 10× its longest earlier run, at least 30s)")
	reportDir := fs.String("report", defaultReportDir, `write <backend>.json, .md, .xml and .html into this folder ("" for none)`)
	seed := fs.Uint64("seed", 0, "input seed (a failing case prints the seed that reproduces it)")
	perf := fs.Bool("perf", false, "performance mode: time each supported op × shape and print GB/s and GFLOP/s beside the device's peaks (no correctness cases)")
	var pf perfFlags
	fs.IntVar(&pf.threads, "threads", 2, "with --perf, the context's thread count (as xpu bench --kernels)")
	fs.DurationVar(&pf.minTime, "perf-time", time.Second, "with --perf, the least time each case runs")
	fs.StringVar(&pf.harness, "harness", defaultHarness, `with --perf, the bench harness whose read loop measures a CPU's read bandwidth (as xpu bench --kernels)`)
	opsDoc := fs.String("ops-doc", "", `write the op coverage matrix (docs/ops.md) of the --plugin backends (default: every in-tree one) to this file ("-": stdout)`)
	compare := fs.Bool("compare", false, "with two report files OLD.json NEW.json: list the regressions from OLD to NEW (exit 1 if any)")
	applyUnits := backendSettingFlags(fs)
	setUsage(fs, stderr,
		"usage: xpu conform [--plugin NAME|PATH]... [--all] [--device N] [--filter REGEX] [--isolated [--timeout D]] [--validate] [--report DIR] [--seed S]",
		"       xpu conform --perf [--plugin NAME|PATH]... [--all] [--device N] [--filter REGEX] [--threads N] [--perf-time D]",
		"       xpu conform --compare OLD.json NEW.json",
		"       xpu conform --ops-doc FILE [--plugin NAME|PATH]...",
	)
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *compare {
		if fs.NArg() != 2 || len(plugins) > 0 || *all {
			fs.Usage()
			return 2
		}
		return runConformCompare(fs.Arg(0), fs.Arg(1), stdout, stderr)
	}
	if len(plugins) == 0 && !*all && *opsDoc == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	if err := applyUnits(); err != nil {
		return usageExit(stderr, "xpu conform: %v", err)
	}
	// in process, the verdict comes from a supervising parent (conform_supervise.go)
	sentinel := conformChildSentinel()
	if sentinel == nil && !*isolated {
		return superviseConform(ctx, args, stdout, stderr)
	}
	defer func() { writeSentinel(sentinel, code) }()
	var opts []conformance.Option
	opts = append(opts, conformance.WithDevice(*device), conformance.WithSeed(*seed),
		conformance.WithProgress(stdout), conformance.WithBuild(buildVersionCommit()))
	var filterRE *regexp.Regexp
	if *filter != "" {
		re, err := regexp.Compile(*filter)
		if err != nil {
			return usageExit(stderr, "xpu conform: --filter: %v", err)
		}
		opts = append(opts, conformance.WithFilter(re))
		filterRE = re
	}
	if *reportDir != "" {
		opts = append(opts, conformance.WithReportDir(*reportDir))
	}
	var lopts []loader.Option
	if *isolated {
		lopts = append(lopts, loader.Isolated())
	}
	if *validate {
		lopts = append(lopts, loader.WithValidation())
	}
	if *timeout < 0 {
		return usageExit(stderr, "xpu conform: --timeout %v: must be 0 (automatic) or more", *timeout)
	}
	lopts = append(lopts, loader.WithExecuteTimeout(*timeout))
	if *opsDoc != "" {
		return runOpsDoc(ctx, *opsDoc, plugins, *device, lopts, stdout, stderr)
	}

	type target struct {
		arg string // what --plugin names it by, for the rerun command
		b   core.Backend
	}
	var targets []target
	var total conformance.Report
	openFailed := func(what, name string, err error) {
		fmt.Fprintf(stdout, "== %s: FAIL [error] cannot open: %v\n", what, err)
		total.Failed++
		// an earlier run's report of this backend must not stay in place as if it were current
		if *reportDir != "" && name != "" {
			if rerr := conformance.RemoveReportFiles(*reportDir, name, *device); rerr != nil {
				fmt.Fprintf(stderr, "xpu conform: %v\n", rerr)
			}
		}
	}
	for _, p := range plugins {
		b, err := loader.Open(ctx, p, lopts...)
		if err != nil {
			name := p
			if strings.ContainsRune(p, '/') || strings.HasSuffix(p, ".so") {
				name = "" // a file: its backend name is unknown when it cannot be probed
			}
			openFailed(p, name, err)
			continue
		}
		targets = append(targets, target{arg: p, b: b})
	}
	if *all {
		bs, cands, err := loader.OpenAll(ctx, lopts...)
		if err != nil {
			fmt.Fprintf(stderr, "xpu conform: %v\n", err)
			return 1
		}
		var found, failed []string
		for _, c := range cands {
			if c.Chosen && c.Score > 0 && c.Err != nil {
				openFailed(c.Path, c.Name, c.Err)
				failed = append(failed, c.Name)
			}
		}
		for _, b := range bs {
			if b.Info().Name == loader.RefName {
				b.Close()
				continue
			}
			targets = append(targets, target{arg: b.Info().Name, b: b})
			found = append(found, b.Info().Name)
		}
		total.Failed += requireBackends(stdout, found, failed)
	}
	for _, t := range targets {
		info := t.b.Info()
		fmt.Fprintf(stdout, "== %s %s (%s) device %d\n", info.Name, info.Version, orBuiltin(info.Path), *device)
		if *perf {
			err := runConformPerf(ctx, t.b, *device, filterRE, pf, *reportDir, stdout, stderr)
			if cerr := t.b.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("closing the backend: %w", cerr)
			}
			if err != nil {
				fmt.Fprintf(stdout, "== %s: FAIL [error] %v\n", info.Name, err)
				total.Failed++
			}
			continue
		}
		repro := "xpu conform --plugin " + t.arg
		if *device != 0 {
			repro += fmt.Sprintf(" --device %d", *device)
		}
		if *isolated {
			repro += " --isolated"
		}
		if *validate {
			repro += " --validate"
		}
		runOpts := append(opts, conformance.WithReproCommand(repro))
		if *isolated && info.Path != "" {
			// level 1 needs the plugin in a process: a child of its own (conform_abichild.go)
			runOpts = append(runOpts, conformance.WithABIRunner(abiChildRunner(info.Path, *device, *seed, *filter)))
		}
		rep, err := conformance.Run(ctx, t.b, runOpts...)
		if cerr := t.b.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("closing the backend: %w", cerr)
		}
		if err != nil {
			// printed and counted before the backend's line, so that line and the last agree
			fmt.Fprintf(stdout, "== %s: FAIL [error] %v\n", info.Name, err)
			if rep == nil {
				total.Failed++
			} else {
				rep.Failed++
			}
		}
		if rep != nil {
			total.Passed += rep.Passed
			total.Failed += rep.Failed
			total.Unsupported += rep.Unsupported
			total.Skipped += rep.Skipped
			fmt.Fprintf(stdout, "== %s: %s, %d skipped, %.1f s\n", info.Name, rep.Summary(), rep.Skipped, rep.Seconds)
			for _, l := range rep.Levels {
				fmt.Fprintf(stdout, "== level %s\n", l)
			}
			if *reportDir != "" {
				fmt.Fprintf(stdout, "== reports: %s/%s.{json,md,xml,html}\n", *reportDir, rep.FileBase())
			}
		}
	}
	if *perf {
		if total.Failed > 0 {
			return 1
		}
		return 0
	}
	fmt.Fprintln(stdout, total.Summary())
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "xpu conform: interrupted: the counts above are partial")
		return exitInterrupted
	}
	if total.Failed > 0 {
		return 1
	}
	return 0
}

func orBuiltin(path string) string {
	if path == "" {
		return "built in"
	}
	return path
}
