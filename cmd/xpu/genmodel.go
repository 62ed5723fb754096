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
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/llm/sparse"
	"github.com/xpuhub/xpu/llm/synth"
)

func init() {
	register(&command{name: "gen-model", summary: "write a synthetic GGUF model (random weights) for benchmarks", run: runGenModel})
}

func runGenModel(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gen-model", flag.ContinueOnError)
	fs.SetOutput(stderr)
	archName := fs.String("arch", "llama", "architecture: "+strings.Join(synth.Architectures(), ", ")+" (llama3: Llama 3.1 rope_freqs.weight; mistral: a sliding window; both written as llama)")
	params := fs.String("params", "1B", "size preset: "+strings.Join(synth.Presets(), ", "))
	typ := fs.String("type", "q4_0", "matrix dtype: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q2_k, q3_k (K-quants need rows that are multiples of 256: --params 6M or 1B and up)")
	seed := fs.Uint64("seed", 1, "weight seed")
	outliers := fs.Int("outliers", 0, "plant activation outliers in this many channels (their norm weights 50-100x, the projections' matching weight columns divided by the square root of that)")
	out := fs.String("o", "", "output file (required)")
	act := fs.String("act", "silu", "FFN activation: silu, relu, relu2 (written as <arch>.feed_forward_activation; tensors do not depend on it)")
	sparsity := fs.Float64("sparsity", 0, "shape FFN firing so this share of gate values is ≤ 0 (0: plain random weights); same value for a ReLU model and its SiLU twin")
	skew := fs.String("skew", "zipf", "firing skew with --sparsity: zipf (few hot neurons, a long rare tail) or uniform")
	measure := fs.Int("measure", -1, "tokens of the built-in text to measure the achieved firing on after writing (-1: 64, or 16 for 3B and up; 0: skip)")
	setUsage(fs, stderr, "usage: xpu gen-model [--arch llama|llama3|mistral|qwen2|qwen3|phi3|gemma2|gemma3|smollm3|granite] [--params 1B] [--type q4_0] [--seed S] [--outliers N] [--act relu --sparsity 0.9 --skew zipf] -o FILE")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *out == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	fail := failer(stderr, "xpu gen-model")
	dt, err := core.ParseDType(*typ)
	if err != nil {
		return fail(err)
	}
	spec, err := synth.Preset(*archName, *params, dt, *seed)
	if err == nil && *outliers != 0 {
		spec.Outliers = *outliers
		spec.Name += fmt.Sprintf("-outliers%d", *outliers)
		err = synth.Check(spec)
	}
	if err != nil {
		return fail(err)
	}
	a, err := arch.ParseActivation(*act)
	if err != nil {
		return fail(err)
	}
	spec.Activation, spec.Sparsity, spec.Skew = string(a), *sparsity, *skew
	if *sparsity > 0 {
		spec.Name += fmt.Sprintf("-sparse%g-%s", *sparsity, *skew)
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
	n := *measure
	if n < 0 {
		n = 64
		if spec.Dim >= 3072 {
			n = 16
		}
	}
	if *sparsity > 0 && n > 0 {
		if err := printFiring(ctx, stdout, *out, n); err != nil {
			return fail(err)
		}
	}
	return 0
}

// printFiring measures the gate firing of the model just written on n tokens of the built-in
// text (for a SiLU model: where a ReLU gate would be 0) and prints sparsity and skew.
func printFiring(ctx context.Context, w io.Writer, path string, n int) error {
	m, err := llm.Open(path)
	if err != nil {
		return err
	}
	defer m.Close()
	toks := m.Tokenizer.Encode(sparse.DefaultText, true)
	if len(toks) > n {
		toks = toks[:n]
	}
	t0 := time.Now()
	st, err := sparse.Measure(ctx, m, toks)
	if err != nil {
		return err
	}
	lo, hi := 1.0, 0.0
	for _, s := range st.LayerSparsity {
		lo, hi = min(lo, s), max(hi, s)
	}
	fmt.Fprintf(w, "measured on %d tokens (%.1f s): sparsity %.3f (layers %.3f..%.3f), top 10%% of neurons carry %.0f%% of activations, %.1f%% of neurons fire for over half the tokens\n",
		st.Tokens, time.Since(t0).Seconds(), st.Sparsity, lo, hi, 100*st.Top10Share, 100*st.HotNeurons)
	return nil
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
