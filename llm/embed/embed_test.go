package embed

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/llmtest"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/spec"
)

// outputWeight is the model's output head as float32 rows [vocab][dim].
func outputWeight(t *testing.T, m *llm.Model) [][]float32 {
	t.Helper()
	w, ok := m.Weight("output.weight")
	if !ok {
		w, _ = m.Weight("token_embd.weight")
	}
	flat, err := core.Dequantize(w.DType, w.Data, 0)
	require.NoError(t, err)
	d := m.Config.Dim
	rows := make([][]float32, len(flat)/d)
	for i := range rows {
		rows[i] = flat[i*d : (i+1)*d]
	}
	return rows
}

func cosine(a, b []float32) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab += float64(a[i]) * float64(b[i])
		aa += float64(a[i]) * float64(a[i])
		bb += float64(b[i]) * float64(b[i])
	}
	return ab / math.Sqrt(aa*bb)
}

// TestEmbedderPoolings: an embedding is the final-normed hidden state the logits are made of
// (its product with the output head is the runner's logits, up to scale), of unit length; mean
// pooling averages every prefix's last state (attention is causal), CLS is the first token's.
func TestEmbedderPoolings(t *testing.T) {
	ctx := context.Background()
	m := llmtest.Stories(t)
	dev := llmtest.RefDevice(t)
	pool, err := PoolingOf(m)
	require.NoError(t, err)
	assert.Equal(t, PoolingLast, pool, "a decoder without pooling_type embeds with its last token")
	e, err := New(ctx, m, dev, llm.WithChunkSize(4), llm.WithContextLength(64))
	require.NoError(t, err)
	defer e.Close()
	assert.Equal(t, m.Config.Dim, e.Dim())
	r, err := llm.NewRunner(ctx, m, dev, llm.WithChunkSize(4), llm.WithContextLength(64))
	require.NoError(t, err)
	defer r.Close()
	W := outputWeight(t, m)
	ids := m.Tokenizer.Encode("Once upon a time, there was a little dog.", true)
	require.Greater(t, len(ids), 5)

	emb, err := e.Embed(ctx, ids)
	require.NoError(t, err)
	require.Len(t, emb, m.Config.Dim)
	var ss float64
	for _, v := range emb {
		ss += float64(v) * float64(v)
	}
	assert.InDelta(t, 1, ss, 1e-5, "unit length")
	logits, err := r.Prefill(ctx, ids)
	require.NoError(t, err)
	fromEmb := make([]float32, len(W))
	for i, row := range W {
		for j, v := range row {
			fromEmb[i] += v * emb[j]
		}
	}
	assert.Greater(t, cosine(fromEmb, logits), 0.9999, "the embedding times the output head is the logits")

	mean, err := e.pooled(ctx, ids, PoolingMean)
	require.NoError(t, err)
	want := make([]float64, m.Config.Dim)
	for i := range ids {
		last, err := e.pooled(ctx, ids[:i+1], PoolingLast)
		require.NoError(t, err)
		for j, v := range last {
			want[j] += float64(v) / float64(len(ids))
		}
	}
	for j := range want {
		assert.InDelta(t, want[j], mean[j], 1e-4, "mean, dim %d", j)
	}
	cls, err := e.pooled(ctx, ids, PoolingCLS)
	require.NoError(t, err)
	first, err := e.pooled(ctx, ids[:1], PoolingLast)
	require.NoError(t, err)
	assert.InDeltaSlice(t, first, cls, 1e-5)

	again, err := e.Embed(ctx, ids)
	require.NoError(t, err)
	assert.Equal(t, emb, again, "the cache is reset between texts")
}

func TestEmbedderErrors(t *testing.T) {
	ctx := context.Background()
	m := llmtest.Stories(t)
	e, err := New(ctx, m, llmtest.RefDevice(t), llm.WithContextLength(8), llm.WithChunkSize(4))
	require.NoError(t, err)
	defer e.Close()
	for _, tc := range []struct {
		name string
		ids  []int32
		want error
	}{
		{"empty", nil, core.ErrInvalidArgument},
		{"too long", make([]int32, 9), llm.ErrContextFull},
		{"outside the vocabulary", []int32{1, int32(m.Config.Vocab)}, core.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Embed(ctx, tc.ids)
			require.ErrorIs(t, err, tc.want)
		})
	}
	_, err = New(ctx, m, llmtest.RefDevice(t), spec.WithVerifyLengths(2))
	require.ErrorIs(t, err, core.ErrUnsupported)
	_, err = New(ctx, nil, llmtest.RefDevice(t))
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.Equal(t, "mean", PoolingMean.String())
}
