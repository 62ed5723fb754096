// Package llmbench measures a model end to end in the shape of llama.cpp's llama-bench, so
// that the two can be run side by side on the same GGUF file (bench/vs-llamacpp.sh):
//
//   - ppN: prompt processing, N tokens in one llm.Runner.Prefill call after a reset;
//   - tgN: text generation, N single-token llm.Runner.Decode calls;
//   - ppN+tgM: both, timed together (llama-bench's -pg);
//   - "@ dD": any of them with D tokens already in the KV cache (llama-bench's -d), prefilled
//     untimed before the timed part.
//
// Each test starts with an untimed warm-up run (llama-bench's: a prefill of one chunk and one
// decode step, which touches every prepared graph and weight once) and is then repeated; a
// Result keeps every repetition and reports tokens/s as mean ± sample standard deviation of
// the per-repetition rates, as llama-bench does. Tokens are pseudo-random ids from the
// vocabulary (speed does not depend on their values) and no sampling is done, so the figures
// are the runner's forward passes alone.
//
// `xpu bench -m MODEL` is the command line; WriteMarkdown, WriteJSON and WriteCSV are its
// output formats, whose JSON and CSV field names are llama-bench's where the two measure the
// same thing.
package llmbench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
)

// ErrInvalidTest: a test that measures nothing or cannot fit the runner's context.
var ErrInvalidTest = errors.New("llmbench: invalid test")

// Test is one measurement: Prompt tokens prefilled and Gen tokens decoded, timed together,
// after Depth untimed tokens. Prompt or Gen may be 0, not both.
type Test struct {
	Prompt int
	Gen    int
	Depth  int
}

// Name is llama-bench's label: "pp512", "tg128", "pp512+tg128", with " @ d1024" for a depth.
func (t Test) Name() string {
	var s string
	switch {
	case t.Prompt > 0 && t.Gen > 0:
		s = fmt.Sprintf("pp%d+tg%d", t.Prompt, t.Gen)
	case t.Prompt > 0:
		s = fmt.Sprintf("pp%d", t.Prompt)
	default:
		s = fmt.Sprintf("tg%d", t.Gen)
	}
	if t.Depth > 0 {
		s += fmt.Sprintf(" @ d%d", t.Depth)
	}
	return s
}

// Tokens is how many tokens a repetition times: the rate's numerator.
func (t Test) Tokens() int { return t.Prompt + t.Gen }

// ContextNeeded is the KV cache length the test needs.
func (t Test) ContextNeeded() int { return t.Depth + t.Prompt + t.Gen }

// Validate reports a test that measures nothing or has negative counts.
func (t Test) Validate() error {
	if t.Prompt < 0 || t.Gen < 0 || t.Depth < 0 || t.Prompt+t.Gen == 0 {
		return fmt.Errorf("%w: prompt %d, gen %d, depth %d (counts must be ≥ 0 and prompt+gen > 0)",
			ErrInvalidTest, t.Prompt, t.Gen, t.Depth)
	}
	return nil
}

// Tests expands llama-bench's lists into its order: every pp (non-zero prompt), then every tg
// (non-zero gen), then every pp+tg pair, each at every depth. Zeros in prompts and gens are
// skipped, as llama-bench's -p 0 / -n 0 skip that kind of test.
func Tests(prompts, gens []int, pairs [][2]int, depths []int) []Test {
	if len(depths) == 0 {
		depths = []int{0}
	}
	var ts []Test
	for _, d := range depths {
		for _, p := range prompts {
			if p != 0 {
				ts = append(ts, Test{Prompt: p, Depth: d})
			}
		}
		for _, n := range gens {
			if n != 0 {
				ts = append(ts, Test{Gen: n, Depth: d})
			}
		}
		for _, pg := range pairs {
			ts = append(ts, Test{Prompt: pg[0], Gen: pg[1], Depth: d})
		}
	}
	return ts
}

// Options configures Measure.
type Options struct {
	Reps     int    // timed repetitions (at least 1)
	NoWarmup bool   // skip the untimed warm-up run
	Seed     uint64 // token ids' seed (0 is a fixed default)
}

// Measure runs t on r Options.Reps times and returns each repetition's wall time. The runner's
// cache is reset before every run; its context must hold t.ContextNeeded() tokens.
func Measure(ctx context.Context, r *llm.Runner, t Test, o Options) ([]time.Duration, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if o.Reps < 1 {
		return nil, fmt.Errorf("%w: %d repetitions (at least 1)", ErrInvalidTest, o.Reps)
	}
	if n := t.ContextNeeded(); n > r.ContextLength() {
		return nil, fmt.Errorf("%w: %s needs %d tokens of context, the runner holds %d",
			ErrInvalidTest, t.Name(), n, r.ContextLength())
	}
	seed := o.Seed
	if seed == 0 {
		seed = 0x5eed
	}
	rng := rand.New(rand.NewPCG(seed, uint64(t.Depth)<<32|uint64(t.Prompt)<<16|uint64(t.Gen)))
	vocab := r.Model().Config.Vocab
	toks := func(n int) []int32 {
		ids := make([]int32, n)
		for i := range ids {
			ids[i] = int32(rng.IntN(vocab))
		}
		return ids
	}
	if !o.NoWarmup {
		r.Reset()
		if t.Prompt > 0 {
			if _, err := r.Prefill(ctx, toks(min(r.ChunkSize(), t.Prompt))); err != nil {
				return nil, fmt.Errorf("llmbench: warm-up prefill: %w", err)
			}
			r.Reset() // the context may hold no more than the test needs
		}
		if _, err := r.Decode(ctx, toks(1)[0]); err != nil {
			return nil, fmt.Errorf("llmbench: warm-up decode: %w", err)
		}
	}
	samples := make([]time.Duration, 0, o.Reps)
	for rep := 0; rep < o.Reps; rep++ {
		r.Reset()
		if t.Depth > 0 {
			if _, err := r.Prefill(ctx, toks(t.Depth)); err != nil {
				return nil, fmt.Errorf("llmbench: %s: depth prefill: %w", t.Name(), err)
			}
		}
		prompt, gen := toks(t.Prompt), toks(t.Gen)
		t0 := time.Now()
		if t.Prompt > 0 {
			if _, err := r.Prefill(ctx, prompt); err != nil {
				return nil, fmt.Errorf("llmbench: %s: prefill: %w", t.Name(), err)
			}
		}
		for _, id := range gen {
			if _, err := r.Decode(ctx, id); err != nil {
				return nil, fmt.Errorf("llmbench: %s: decode: %w", t.Name(), err)
			}
		}
		samples = append(samples, time.Since(t0))
	}
	r.Reset()
	return samples, nil
}

// ModelInfo describes the measured file as llama-bench does.
type ModelInfo struct {
	Filename string // the path as given
	Type     string // "llama 1.0B Q4_0": architecture, parameters, matrix dtype
	Size     int64  // bytes of every tensor
	Params   int64  // elements of every tensor
}

// Describe reads m's ModelInfo; path is how the user named the file.
func Describe(path string, m *llm.Model) ModelInfo {
	info := ModelInfo{Filename: path}
	for _, t := range m.File.Tensors {
		info.Size += t.Size
		info.Params += t.Shape.NumElements()
	}
	dt := "?"
	if t, ok := m.File.Tensor("blk.0.ffn_up.weight"); ok {
		dt = strings.ToUpper(t.DType.String())
	}
	info.Type = fmt.Sprintf("%s %s %s", m.Config.Arch, humanCount(info.Params), dt)
	return info
}

// humanCount writes a parameter count as llama.cpp's size labels do: 975M, 1.2B, 260K.
func humanCount(n int64) string {
	f := float64(n)
	switch {
	case f >= 1e9:
		return trimZero(fmt.Sprintf("%.1f", f/1e9)) + "B"
	case f >= 1e6:
		return fmt.Sprintf("%.0fM", f/1e6)
	case f >= 1e3:
		return fmt.Sprintf("%.0fK", f/1e3)
	}
	return fmt.Sprint(n)
}

func trimZero(s string) string { return strings.TrimSuffix(s, ".0") }

// Result is one test on one configuration with every repetition's time.
type Result struct {
	Model   ModelInfo
	Backend string     // backend name: "neon", "opencl", "ref"
	Device  string     // device id: "neon:0"
	Threads int        // 0: the backend's default
	Chunk   int        // prefill chunk length
	KV      core.DType // the K cache's dtype
	KVV     core.DType // the V cache's dtype (core.InvalidDType: KV's)
	Test    Test
	Time    time.Time // when the test started
	Samples []time.Duration
}

// VType is the V cache's dtype.
func (r Result) VType() core.DType {
	if r.KVV == core.InvalidDType {
		return r.KV
	}
	return r.KVV
}

// kvLabel names the cache's dtypes: one when K and V share it, else "k/v".
func (r Result) kvLabel() string {
	if r.VType() == r.KV {
		return r.KV.String()
	}
	return r.KV.String() + "/" + r.VType().String()
}

// Rates is tokens/s of every repetition.
func (r Result) Rates() []float64 {
	out := make([]float64, len(r.Samples))
	for i, d := range r.Samples {
		if d > 0 {
			out[i] = float64(r.Test.Tokens()) / d.Seconds()
		}
	}
	return out
}

// TokensPerSecond is the mean and sample standard deviation of Rates (llama-bench's avg_ts and
// stddev_ts); the deviation is 0 for one repetition.
func (r Result) TokensPerSecond() (mean, stddev float64) { return meanStd(r.Rates()) }

func meanStd(xs []float64) (mean, stddev float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	if len(xs) < 2 {
		return mean, 0
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(ss / float64(len(xs)-1))
}
