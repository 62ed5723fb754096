package llm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/quant"
	"github.com/xpuhub/xpu/llm/sample"
)

// cacheRows are layer l's K (which 0) or V (1) cache rows [from, from+n) as floats.
func cacheRows(t *testing.T, r *Runner, l, which, from, n int) []float32 {
	t.Helper()
	kRow, vRow := r.cfg.kv.RowBytes(r.m.Config)
	rowBytes, dt := kRow, r.cfg.kv.K
	if which == 1 {
		rowBytes, dt = vRow, r.cfg.kv.V
	}
	b := r.rt.Arena().Bytes(r.kv[l][which])[int64(from)*rowBytes : int64(from+n)*rowBytes]
	x, err := core.Dequantize(dt, b, 0)
	require.NoError(t, err)
	return x
}

// shiftCase is a model and KV cache type for the context shift tests, with the bound on the
// shifted K rows' NMSE against a fresh recompute at their new positions: the rounding of one
// more conversion to the cache's dtype.
type shiftCase struct {
	name  string
	model func(t testing.TB) *Model
	kv    core.DType
	bound float64
}

func shiftCases() []shiftCase {
	return []shiftCase{
		{"stories/f32", openStories, core.F32, 1e-10},
		{"stories/f16", openStories, core.F16, 1e-5},
		{"kv32/q8_0", kvModel, core.Q8_0, 1e-3},
		{"kv32/q4_0", kvModel, core.Q4_0, 5e-2},
		// LongRoPE: the host's cos/sin tables with an attention factor other than 1
		{"phi3/f32", func(t testing.TB) *Model { return tinyArch(t, "phi3", 2, 5) }, core.F32, 1e-10},
	}
}

// TestShiftedKMatchesRecompute: after a context shift, layer 0's moved K rows, rotated back by
// the discarded count, are the K rows a fresh prefill of the kept tokens computes at their
// new positions (layer 0's K and V depend only on the token and its position), and its V rows
// are moved unchanged. Without the rotation they would not be: the moved rows before the
// shift differ from the recompute.
func TestShiftedKMatchesRecompute(t *testing.T) {
	for _, tc := range shiftCases() {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			m := tc.model(t)
			ids := m.Tokenizer.Encode(storyPrompt+" "+storyPrompt, true)
			require.GreaterOrEqual(t, len(ids), 48)
			ids = ids[:48]
			const keep, n = 5, 17
			open := func() *Runner {
				r, err := NewRunner(ctx, m, refDevice(t), WithKVCacheType(tc.kv), WithChunkSize(8), WithContextLength(64))
				require.NoError(t, err)
				t.Cleanup(func() { _ = r.Close() })
				return r
			}
			a := open()
			_, err := a.Prefill(ctx, ids)
			require.NoError(t, err)
			moved := len(ids) - keep - n
			unrotated := cacheRows(t, a, 0, 0, keep+n, moved)
			require.NoError(t, a.ShiftContext(ctx, keep, n))
			require.Equal(t, len(ids)-n, a.Len())
			require.Equal(t, append(append([]int32(nil), ids[:keep]...), ids[keep+n:]...), a.Tokens())

			b := open()
			_, err = b.Prefill(ctx, a.Tokens())
			require.NoError(t, err)
			fresh := cacheRows(t, b, 0, 0, keep, moved)
			got := quant.NMSE(cacheRows(t, a, 0, 0, keep, moved), fresh)
			t.Logf("shifted K rows vs recompute: NMSE %.3g (unrotated %.3g)", got, quant.NMSE(unrotated, fresh))
			assert.Less(t, got, tc.bound)
			assert.Greater(t, quant.NMSE(unrotated, fresh), 1e-3, "the rotation must matter for this test to mean anything")
			assert.Equal(t, cacheRows(t, b, 0, 0, 0, keep), cacheRows(t, a, 0, 0, 0, keep), "kept K rows")
			assert.Less(t, quant.NMSE(cacheRows(t, a, 0, 1, keep, moved), cacheRows(t, b, 0, 1, keep, moved)), 1e-12, "moved V rows")

			// the shifted runner goes on decoding where the fresh one does, give or take the
			// deeper layers' memory of the discarded tokens
			la, err := a.Decode(ctx, ids[0])
			require.NoError(t, err)
			assert.Equal(t, len(ids)-n+1, a.Len())
			assert.Len(t, la, m.Config.Vocab)
		})
	}
}

func TestShiftContextBadArguments(t *testing.T) {
	ctx := context.Background()
	m := openStories(t)
	r, err := NewRunner(ctx, m, refDevice(t), WithChunkSize(8), WithContextLength(32))
	require.NoError(t, err)
	defer r.Close()
	_, err = r.Prefill(ctx, m.Tokenizer.Encode(storyPrompt, true)[:20])
	require.NoError(t, err)
	for _, c := range []struct{ keep, n int }{{-1, 2}, {0, 0}, {10, 11}, {21, 1}} {
		assert.ErrorIs(t, r.ShiftContext(ctx, c.keep, c.n), core.ErrInvalidArgument, "keep %d n %d", c.keep, c.n)
	}
	assert.Equal(t, 20, r.Len(), "a refused shift changes nothing")
	require.NoError(t, r.ShiftContext(ctx, 0, 20), "discarding everything is a shift too")
	assert.Equal(t, 0, r.Len())
}

// TestGenerateContextShift: with WithContextShift, generation goes on past a full context
// (plainly and with speculative decoding), keeping the first tokens; without it, it stops
// with StopContext.
func TestGenerateContextShift(t *testing.T) {
	ctx := context.Background()
	m := openStories(t)
	const ctxLen, keep, tokens = 48, 4, 150
	prompt := "Once upon a time"
	ids := m.Tokenizer.Encode(prompt, true)
	for _, tc := range []struct {
		name string
		opts []GenerateOption
		ro   []RunnerOption
	}{
		{"plain", nil, nil},
		{"f32", nil, []RunnerOption{WithKVCacheType(core.F32)}},
		{"a decode strategy", []GenerateOption{WithStrategy(&plainStrategy{})}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewRunner(ctx, m, refDevice(t), append([]RunnerOption{WithChunkSize(8), WithContextLength(ctxLen)}, tc.ro...)...)
			require.NoError(t, err)
			defer r.Close()
			res, err := r.Generate(ctx, prompt, append([]GenerateOption{WithMaxTokens(tokens), WithSampler(sample.Config{Temperature: 0.8, Seed: 3})}, tc.opts...)...)
			require.NoError(t, err)
			assert.Equal(t, StopContext, res.Stop, "without a shift")
			assert.Less(t, len(res.Tokens), ctxLen)

			res, err = r.Generate(ctx, prompt, append([]GenerateOption{WithMaxTokens(tokens), WithContextShift(keep),
				WithSampler(sample.Config{Temperature: 0.8, Seed: 3})}, tc.opts...)...)
			require.NoError(t, err)
			assert.Equal(t, StopMaxTokens, res.Stop)
			assert.Len(t, res.Tokens, tokens)
			assert.LessOrEqual(t, r.Len(), ctxLen)
			// keep counts BOS on top, as llama.cpp's n_keep
			assert.Equal(t, ids[:keep+1], r.Tokens()[:keep+1])
			assert.Equal(t, res.Tokens[len(res.Tokens)-10:len(res.Tokens)-1], r.Tokens()[r.Len()-9:], "the last tokens are in the cache")
		})
	}
}

// TestGenerateContextShiftKeepsAll: a keep that covers the whole cache leaves nothing to
// discard, and generation stops at the full context as without a shift.
func TestGenerateContextShiftKeepsAll(t *testing.T) {
	ctx := context.Background()
	m := openStories(t)
	r, err := NewRunner(ctx, m, refDevice(t), WithChunkSize(8), WithContextLength(24))
	require.NoError(t, err)
	defer r.Close()
	ids := m.Tokenizer.Encode(storyPrompt, true)[:23]
	res, err := r.Generate(ctx, "", WithPromptTokens(ids), WithMaxTokens(50), WithContextShift(-1))
	require.NoError(t, err)
	assert.Equal(t, StopContext, res.Stop)
}
