package llm

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/quant"
)

const storyPrompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball."

// TestChunkSizesAgree: prefill in chunks of 1, 7, 32 and the whole prompt (padded last chunks
// included) must give the same logits and the same greedy continuation, since every chunk
// length has its own prepared graphs but they compute the same function.
func TestChunkSizesAgree(t *testing.T) {
	m := openStories(t)
	prompt := m.Tokenizer.Encode(storyPrompt, true)
	require.Greater(t, len(prompt), 32, "the prompt must span several 32-token chunks")
	var wantTokens []int32
	var wantLogits []float32
	for _, chunk := range []int{1, 7, 32, len(prompt)} {
		t.Run(fmt.Sprint(chunk), func(t *testing.T) {
			r, err := NewRunner(context.Background(), m, refDevice(t), WithChunkSize(chunk), WithContextLength(128))
			require.NoError(t, err)
			defer r.Close()
			logits, err := r.Prefill(context.Background(), prompt)
			require.NoError(t, err)
			require.Len(t, logits, m.Config.Vocab)
			r.Reset()
			res, err := r.Generate(context.Background(), storyPrompt, WithMaxTokens(16))
			require.NoError(t, err)
			require.Len(t, res.Tokens, 16)
			if wantTokens == nil {
				wantTokens, wantLogits = res.Tokens, logits
				return
			}
			assert.Equal(t, wantTokens, res.Tokens)
			assert.InDeltaSlice(t, wantLogits, logits, 1e-4)
		})
	}
	t.Logf("continuation: %q", m.Tokenizer.Decode(wantTokens))
}

func TestContextFull(t *testing.T) {
	m := openStories(t)
	r, err := NewRunner(context.Background(), m, refDevice(t), WithChunkSize(4), WithContextLength(10))
	require.NoError(t, err)
	defer r.Close()
	_, err = r.Prefill(context.Background(), make([]int32, 11))
	require.ErrorIs(t, err, ErrContextFull)
	_, err = r.Prefill(context.Background(), make([]int32, 9))
	require.NoError(t, err)
	_, err = r.Decode(context.Background(), 5)
	require.NoError(t, err)
	_, err = r.Decode(context.Background(), 5)
	require.ErrorIs(t, err, ErrContextFull)
	r.Reset()
	_, err = r.Decode(context.Background(), int32(m.Config.Vocab))
	require.ErrorIs(t, err, core.ErrInvalidArgument)

	res, err := r.Generate(context.Background(), "Once upon a time", WithMaxTokens(100))
	require.NoError(t, err)
	assert.Equal(t, StopContext, res.Stop)

	res, err = r.Generate(context.Background(), "Once upon a time", WithMaxTokens(0))
	require.NoError(t, err)
	assert.Equal(t, StopMaxTokens, res.Stop)
	assert.Empty(t, res.Tokens)
	assert.Equal(t, 5, res.PromptTokens)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = r.Generate(ctx, "Once upon a time")
	assert.ErrorIs(t, err, context.Canceled)
}

// quantizedStories rewrites stories260K with its matrices in dt; ffn_down, whose rows (172)
// are not a multiple of the 32-value block, stays F32 as llama.cpp keeps it.
func quantizedStories(t *testing.T, m *Model, dt core.DType) *Model {
	data, err := quant.Pure(m.File, dt)
	require.NoError(t, err)
	qf, err := gguf.Parse(data)
	require.NoError(t, err)
	qm, err := FromFile(qf)
	require.NoError(t, err)
	return qm
}

// decodeLogits decodes ids one token at a time on a fresh runner of m and returns the
// logits after each.
func decodeLogits(t *testing.T, m *Model, dev core.Device, ids []int32) [][]float32 {
	t.Helper()
	r, err := NewRunner(context.Background(), m, dev, WithChunkSize(1), WithContextLength(len(ids)))
	require.NoError(t, err)
	defer r.Close()
	var out [][]float32
	for _, id := range ids {
		l, err := r.Decode(context.Background(), id)
		require.NoError(t, err)
		out = append(out, l)
	}
	return out
}

func TestQuantizedLogitsNMSE(t *testing.T) {
	m := openStories(t)
	dev := refDevice(t)
	seq := m.Tokenizer.Encode(storyPrompt, true)
	logitsOf := func(model *Model) [][]float32 { return decodeLogits(t, model, dev, seq) }
	want := logitsOf(m)
	for _, dt := range []core.DType{core.Q8_0, core.Q4_0} {
		t.Run(dt.String(), func(t *testing.T) {
			qm := quantizedStories(t, m, dt)
			w, ok := qm.weights["blk.0.attn_q.weight"]
			require.True(t, ok)
			require.Equal(t, dt, w.dtype)
			require.Equal(t, core.F32, qm.weights["blk.0.ffn_down.weight"].dtype)
			got := logitsOf(qm)
			var num, den float64
			for i := range want {
				for j := range want[i] {
					d := float64(got[i][j] - want[i][j])
					num += d * d
					den += float64(want[i][j]) * float64(want[i][j])
				}
			}
			nmse := num / den
			t.Logf("%s logits NMSE vs F32: %.3g (bound %.1g)", dt, nmse, quant.NMSEBound[dt])
			require.False(t, math.IsNaN(nmse))
			require.Less(t, nmse, quant.NMSEBound[dt])
			require.Greater(t, nmse, 0.0, "quantization must change something")
		})
	}
}

// countingDevice counts Prepare calls on the contexts it opens.
type countingDevice struct {
	core.Device
	prepares *int
}

func (d countingDevice) NewContext(ctx context.Context, o map[string]string) (core.Context, error) {
	c, err := d.Device.NewContext(ctx, o)
	return countingContext{Context: c, prepares: d.prepares}, err
}

type countingContext struct {
	core.Context
	prepares *int
}

func (c countingContext) Prepare(ctx context.Context, g *core.Graph, opts ...core.PrepareOption) (core.Executable, error) {
	*c.prepares++
	return c.Context.Prepare(ctx, g, opts...)
}

// TestGraphsPreparedOnce: the stage graphs for the prefill chunk and for decoding are prepared
// when the runner is made, and every later chunk, position and prompt reuses them.
func TestGraphsPreparedOnce(t *testing.T) {
	m := openStories(t)
	n := 0
	r, err := NewRunner(context.Background(), m, countingDevice{Device: refDevice(t), prepares: &n}, WithChunkSize(8))
	require.NoError(t, err)
	defer r.Close()
	stages := m.Config.Layers + 1
	require.Equal(t, 2*stages, n, "one stage set for chunk 8, one for decoding")
	for _, p := range []string{storyPrompt, "Once upon a time", "Tom"} {
		_, err := r.Generate(context.Background(), p, WithMaxTokens(4))
		require.NoError(t, err)
	}
	assert.Equal(t, 2*stages, n, "no graph is prepared after the runner is made")
}

// TestF16KVCache: an F16 cache changes the logits only by half-precision rounding of K and V.
func TestF16KVCache(t *testing.T) {
	m := openStories(t)
	ids := m.Tokenizer.Encode(storyPrompt, true)
	logits := func(dt core.DType) []float32 {
		r, err := NewRunner(context.Background(), m, refDevice(t), WithKVCacheType(dt), WithChunkSize(8), WithContextLength(64))
		require.NoError(t, err)
		defer r.Close()
		l, err := r.Prefill(context.Background(), ids)
		require.NoError(t, err)
		return l
	}
	want, got := logits(core.F32), logits(core.F16)
	var num, den float64
	for i := range want {
		d := float64(got[i] - want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	t.Logf("F16 KV cache logits NMSE %.3g", num/den)
	assert.Less(t, num/den, 1e-5)
	assert.Greater(t, num/den, 0.0)

	_, err := NewRunner(context.Background(), m, refDevice(t), WithKVCacheType(core.Q8_0))
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
}
