package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/synth"
)

func init() {
	register(&command{name: "gen-model", summary: "write a synthetic GGUF model (random weights) for benchmarks", run: runGenModel})
}

func runGenModel(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gen-model", flag.ContinueOnError)
	fs.SetOutput(stderr)
	arch := fs.String("arch", "llama", "architecture: llama or qwen2")
	params := fs.String("params", "1B", "size preset: "+strings.Join(synth.Presets(), ", "))
	typ := fs.String("type", "q4_0", "matrix dtype: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q2_k, q3_k (K-quants need rows that are multiples of 256: --params 6M or 1B and up)")
	seed := fs.Uint64("seed", 1, "weight seed")
	outliers := fs.Int("outliers", 0, "plant activation outliers in this many channels (their norm weights 50-100x, the projections' matching weight columns divided by the square root of that)")
	out := fs.String("o", "", "output file (required)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: xpu gen-model [--arch llama|qwen2] [--params 1B] [--type q4_0] [--seed S] [--outliers N] -o FILE")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *out == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "xpu gen-model: %v\n", err)
		return 1
	}
	dt, err := core.ParseDType(*typ)
	if err != nil {
		return fail(err)
	}
	spec, err := synth.Preset(*arch, *params, dt, *seed)
	if err == nil && *outliers != 0 {
		spec.Outliers = *outliers
		spec.Name += fmt.Sprintf("-outliers%d", *outliers)
		err = synth.Check(spec)
	}
	if err != nil {
		return fail(err)
	}
	t0 := time.Now()
	f, err := os.Create(*out)
	if err != nil {
		return fail(err)
	}
	if err := synth.Write(&ctxWriter{ctx: ctx, w: f}, spec); err != nil {
		_ = f.Close()
		_ = os.Remove(*out)
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return fail(err)
	}
	st, err := os.Stat(*out)
	if err != nil {
		return fail(err)
	}
	fmt.Fprintf(stdout, "%s: %s, %.1fM parameters, %d layers, dim %d, %s, %.1f MB in %.1f s\n", *out,
		spec.Arch, float64(spec.Params())/1e6, spec.Layers, spec.Dim, dt, float64(st.Size())/1e6,
		time.Since(t0).Seconds())
	if ch := spec.OutlierChannels(); len(ch) > 0 {
		fmt.Fprintf(stdout, "outlier channels: %v\n", ch)
	}
	return 0
}

// ctxWriter stops a long write when the user interrupts.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c *ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}
