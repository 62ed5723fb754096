package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"text/tabwriter"

	"github.com/xpuhub/xpu/bench"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/loader"
)

func init() {
	register(&command{name: "bench", summary: "CPU kernel benchmarks: GEMM, GEMV, read bandwidth (vs ref and OpenBLAS)", run: runBench})
}

// defaultHarness is where `make bench-neon` builds the OpenBLAS harness.
var defaultHarness = filepath.Join("build", "bench", "libxpubench.so")

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	backend := fs.String("backend", "neon", "backend name or plugin file to measure")
	device := fs.Int("device", 0, "device index")
	threads := fs.Int("threads", 2, "threads of every contender")
	harness := fs.String("harness", defaultHarness, `OpenBLAS harness built by "make bench-neon" ("" to leave OpenBLAS and the read bandwidth out)`)
	withRef := fs.Bool("ref", false, "also time core/ref on the shapes where it takes seconds, not minutes")
	quick := fs.Bool("quick", false, "the small shapes only")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: xpu bench [--backend NAME|PATH] [--device N] [--threads N] [--harness PATH] [--ref] [--quick]")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 || *threads < 1 {
		fs.Usage()
		return 2
	}
	b, err := loader.Open(ctx, *backend)
	if err != nil {
		fmt.Fprintf(stderr, "xpu bench: %v\n", err)
		return 1
	}
	defer b.Close()
	devs := b.Devices()
	if *device < 0 || *device >= len(devs) {
		fmt.Fprintf(stderr, "xpu bench: %s has %d device(s), no device %d\n", b.Info().Name, len(devs), *device)
		return 2
	}
	opts := bench.Options{Threads: *threads, Device: devs[*device], Quick: *quick}
	if *withRef {
		opts.Ref = ref.New().Devices()[0]
	}
	if *harness != "" {
		h, err := bench.LoadHarness(*harness)
		switch {
		case err == nil:
			opts.Harness = h
		case errors.Is(err, core.ErrNotFound):
			fmt.Fprintf(stderr, "xpu bench: no OpenBLAS harness, leaving OpenBLAS and the read bandwidth out: %v\n", err)
		default:
			fmt.Fprintf(stderr, "xpu bench: %v\n", err)
			return 1
		}
	}
	info := devs[*device].Info()
	fmt.Fprintf(stdout, "%s (%s), %d threads\n\n", info.ID(), info.Name, *threads)
	rows, err := bench.Suite(ctx, opts)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tCONTENDER\tVALUE\tUNIT")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%s\n", r.Case, r.Contender, r.Value, r.Unit)
	}
	tw.Flush()
	if err != nil {
		fmt.Fprintf(stderr, "xpu bench: %v\n", err)
		return 1
	}
	return 0
}
