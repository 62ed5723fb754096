package sparse

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/synth"
)

// sparseModel writes a small synthetic model with skewed ReLU firing.
func sparseModel(t testing.TB, dt core.DType, act string) (*llm.Model, string) {
	t.Helper()
	s := synth.Spec{Arch: "llama", Name: "t", Dim: 128, Layers: 2, Heads: 4, KVHeads: 2, FFN: 384, Vocab: 512,
		Context: 256, Type: dt, Seed: 9, Activation: act, Sparsity: 0.9, Skew: "zipf"}
	path := filepath.Join(t.TempDir(), "sp.gguf")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, synth.Write(f, s))
	require.NoError(t, f.Close())
	m, err := llm.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m, path
}

func calib(m *llm.Model, n int) []int32 {
	toks := m.Tokenizer.Encode(DefaultText, true)
	return toks[:min(n, len(toks))]
}

// gen-model's construction gives the sparsity asked for, skewed (Zipf: the top tenth of the
// neurons carries far more than a tenth of the activations), measured by a real forward pass.
func TestSyntheticFiring(t *testing.T) {
	m, _ := sparseModel(t, core.Q8_0, "relu")
	st, err := Measure(context.Background(), m, calib(m, 120))
	require.NoError(t, err)
	assert.InDelta(t, 0.9, st.Sparsity, 0.03)
	assert.Greater(t, st.Top10Share, 0.4)
	assert.Positive(t, st.HotNeurons)
	assert.Less(t, st.HotNeurons, 0.1)
}

func TestPlanRecallAndBudget(t *testing.T) {
	ctx := context.Background()
	m, mpath := sparseModel(t, core.F32, "relu")
	toks := calib(m, 200)
	fx := FixedRegion(m, 64, core.F32, 16)
	o := PlanOptions{Tokens: toks, Budget: fx.Total() + 200*int64(core.F32.Bytes(3*128)), Context: 64, Rank: 16, Epochs: 25, Seed: 1}
	p, rep, err := BuildPlan(ctx, m, o)
	require.NoError(t, err)
	for l, q := range rep.Quality {
		assert.GreaterOrEqual(t, q.Recall, 0.9, "layer %d held-out recall", l)
		assert.Positive(t, q.Precision, "layer %d", l)
	}
	// 75% of the 200 neurons' worth left by the fixed region are hot.
	assert.Equal(t, 150, p.HotCounts[0]+p.HotCounts[1])
	for _, ly := range p.Layers {
		for i := 1; i < len(ly.Freq); i++ {
			require.GreaterOrEqual(t, ly.Freq[i-1], ly.Freq[i], "hot-first order")
		}
	}
	// Training is deterministic for a seed.
	xs, ys := make([]float32, 20*128), make([]bool, 20*384)
	for i := range xs {
		xs[i] = float32(i%7) - 3
	}
	for i := range ys {
		ys[i] = i%5 == 0
	}
	to := TrainOptions{Rank: 4, Epochs: 3, LR: 0.01, Seed: 2, Recall: 0.9}
	a := trainLayer(xs[:10*128], ys[:10*384], 10, xs[10*128:], ys[10*384:], 10, 128, 384, to)
	b := trainLayer(xs[:10*128], ys[:10*384], 10, xs[10*128:], ys[10*384:], 10, 128, 384, to)
	assert.Equal(t, a, b)

	// Written, the sidecar opens for the model; its trained predictor is the one trained, and
	// the oracle predicts exactly the neurons whose gate is > 0.
	path := DefaultPath(mpath)
	require.NoError(t, WriteFile(path, p))
	s, err := OpenFor(path, m)
	require.NoError(t, err)
	defer s.Close()
	assert.Equal(t, p.Recall, s.Recall)
	or, err := NewOracle(s, 0)
	require.NoError(t, err)
	_, err = Forward(ctx, m, toks[:10], func(l int, x, gate []float32) error {
		F := m.Config.FFN
		for tk := 0; tk < 10; tk++ {
			got := or.Predict(l, x[tk*128:(tk+1)*128], nil)
			var want []int32
			for i, n := range s.Order(l) {
				if gate[tk*F+int(n)] > 0 {
					want = append(want, int32(i))
				}
			}
			require.Equal(t, want, got, "layer %d token %d", l, tk)
		}
		return nil
	})
	require.NoError(t, err)

	_, _, err = BuildPlan(ctx, m, PlanOptions{Tokens: toks, Budget: fx.Total() - 1, Context: 64, Rank: 16})
	require.ErrorIs(t, err, ErrBudget)
	assert.Contains(t, err.Error(), "KV cache")
}

func TestPlanRefusesSiLU(t *testing.T) {
	m, _ := sparseModel(t, core.F32, "silu")
	_, _, err := BuildPlan(context.Background(), m, PlanOptions{Tokens: calib(m, 20), Budget: 1 << 30})
	require.ErrorIs(t, err, core.ErrUnsupported)
}
