package sparse

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/sparse/host"
	"github.com/xpuhub/xpu/llm/spec"
	"github.com/xpuhub/xpu/loader"
)

// residentFFN is a host.FFN with every bundle of every layer in the cache (layer l's rows at
// l·F) that selects with a Predictor; it hands every other selected row to later, so both of
// the runner's SPARSE_FFN runs per layer compute something. It tests the runner's side alone.
type residentFFN struct {
	s    *Sidecar
	pred Predictor
	lay  host.Layout
}

func newResidentFFN(s *Sidecar, m *llm.Model, pred Predictor) *residentFFN {
	c := m.Config
	return &residentFFN{s: s, pred: pred, lay: host.Layout{DType: s.BundleType, RowLen: int64(BundleWidth(c.Dim, true)),
		Rows: int64(c.Layers * c.FFN), Neurons: c.FFN, Act: core.SparseReLU}}
}

func (f *residentFFN) Layout() host.Layout { return f.lay }

func (f *residentFFN) Load(_ context.Context, cache []byte) error {
	off := 0
	for l := range f.s.Layers() {
		off += copy(cache[off:], f.s.Bundle(l))
	}
	return nil
}

func (f *residentFFN) Select(_ context.Context, l int, h, _, _ []float32, now, later []int32) (func() error, error) {
	F := f.lay.Neurons
	dim := int(f.lay.RowLen / 3) // h is [c, D]
	seen := make([]bool, F)
	for i := 0; i+dim <= len(h); i += dim {
		for _, row := range f.pred.Predict(l, h[i:i+dim], nil) {
			seen[row] = true
		}
	}
	var a, b []int32
	for row, on := range seen {
		if !on {
			continue
		}
		if len(a) <= len(b) {
			a = append(a, int32(l*F+row))
		} else {
			b = append(b, int32(l*F+row))
		}
	}
	fill := func(dst, src []int32) {
		n := copy(dst, src)
		for i := n; i < len(dst); i++ {
			dst[i] = -1
		}
	}
	fill(now, a)
	fill(later, b)
	return func() error { return nil }, nil
}

// greedy generates n tokens greedily after prompt.
func greedy(t *testing.T, r *llm.Runner, prompt []int32, n int) []int32 {
	t.Helper()
	ctx := context.Background()
	logits, err := r.Prefill(ctx, prompt)
	require.NoError(t, err)
	var out []int32
	for range n {
		tok := int32(slices.Index(logits, slices.Max(logits)))
		out = append(out, tok)
		logits, err = r.Decode(ctx, tok)
		require.NoError(t, err)
	}
	return out
}

// With an oracle (every truly active neuron), sparse decoding gives dense decoding's greedy
// tokens, on the reference and on the neon plugin, for a chunked prefill and one-token decode.
func TestSparseRunnerMatchesDense(t *testing.T) {
	ctx := context.Background()
	m, s, _, toks := plannedF32(t, 200, 5)
	or, err := NewOracle(s, 0)
	require.NoError(t, err)

	devs := map[string]core.Device{"ref": ref.New().Devices()[0]}
	if be, err := loader.Open(ctx, "neon"); err == nil {
		defer be.Close()
		devs["neon"] = be.Devices()[0]
	} else {
		t.Logf("neon plugin not available (%v): reference only", err)
	}
	prompt := toks[:11]
	for name, dev := range devs {
		t.Run(name, func(t *testing.T) {
			dense, err := llm.NewRunner(ctx, m, dev, llm.WithChunkSize(4), llm.WithContextLength(64))
			require.NoError(t, err)
			defer dense.Close()
			want := greedy(t, dense, prompt, 24)

			sp, err := llm.NewRunner(ctx, m, dev, llm.WithChunkSize(4), llm.WithContextLength(64),
				WithFFN(newResidentFFN(s, m, or)))
			require.NoError(t, err)
			defer sp.Close()
			require.Equal(t, want, greedy(t, sp, prompt, 24))
		})
	}
}

// A runner refuses a sparse FFN it cannot run, before preparing anything: a SiLU model, bundles
// for another activation, a layout that does not fit the model, predictors for the wrong layer
// count.
func TestSparseRunnerRefuses(t *testing.T) {
	ctx := context.Background()
	m, s, _, _ := plannedF32(t, 120, 2)
	silu, _ := sparseModel(t, core.F32, "silu")
	dev := ref.New().Devices()[0]
	good := func() *residentFFN { return newResidentFFN(s, m, s.Predictor()) }
	for _, tc := range []struct {
		name  string
		model *llm.Model
		ffn   func() *residentFFN
		is    error
		says  string
	}{
		{"silu model", silu, good, core.ErrUnsupported, "only the ReLU family"},
		{"other activation", m, func() *residentFFN { f := good(); f.lay.Act = core.SparseReLU2; return f }, core.ErrInvalidArgument, "bundles are for activation"},
		{"ungated", m, func() *residentFFN { f := good(); f.lay.Ungated = true; return f }, core.ErrInvalidArgument, "ungated true"},
		{"short rows", m, func() *residentFFN { f := good(); f.lay.RowLen = 64; return f }, core.ErrInvalidArgument, "does not fit the model"},
		{"wrong width", m, func() *residentFFN { f := good(); f.lay.Neurons = 100; return f }, core.ErrInvalidArgument, "does not fit the model"},
		{"predictor count", m, func() *residentFFN {
			f := good()
			f.lay.Predictors = []host.Predictor{{Rank: 1}}
			return f
		}, core.ErrInvalidArgument, "1 predictors for 2 layers"},
		{"predictor size", m, func() *residentFFN {
			f := good()
			f.lay.Predictors = []host.Predictor{{Rank: 2}, {Rank: 2}}
			return f
		}, core.ErrInvalidArgument, "layer 0's predictor (rank 2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := llm.NewRunner(ctx, tc.model, dev, llm.WithContextLength(64), WithFFN(tc.ffn()))
			require.ErrorIs(t, err, tc.is)
			require.ErrorContains(t, err, tc.says)
		})
	}
	_, err := llm.NewRunner(ctx, m, dev, llm.WithContextLength(64), spec.WithVerifyLengths(4), WithFFN(good()))
	require.ErrorIs(t, err, core.ErrUnsupported)
}

// plannedF32 writes and opens the sidecar of a small F32 ReLU model (2 layers, D 128, F 384),
// planned on ntok calibration tokens for context 64 and a budget of the fixed region plus 200
// bundle rows; the sidecar closes with the test.
func plannedF32(t *testing.T, ntok, epochs int) (m *llm.Model, s *Sidecar, path string, toks []int32) {
	t.Helper()
	m, mpath := sparseModel(t, core.F32, "relu")
	toks = calib(m, ntok)
	fx := FixedRegion(m, 64, core.F32, 16)
	p, _, err := BuildPlan(context.Background(), m, PlanOptions{Tokens: toks, Budget: fx.Total() + 200*core.F32.Bytes(3*128),
		Context: 64, Rank: 16, Epochs: epochs, Seed: 1})
	require.NoError(t, err)
	path = DefaultPath(mpath)
	require.NoError(t, WriteFile(path, p))
	s, err = OpenFor(path, m)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return m, s, path, toks
}
