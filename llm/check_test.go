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
	"github.com/xpuhub/xpu/llm/sample"
)

// synthRunner opens a runner on the reference device for the small synthetic model, edited.
func synthRunner(t *testing.T, editKV func([]gguf.KeyValue) []gguf.KeyValue,
	editT func([]gguf.WriteTensor) []gguf.WriteTensor, opts ...RunnerOption) *Runner {
	m, err := FromFile(rewrite(t, editKV, editT))
	require.NoError(t, err)
	r, err := NewRunner(context.Background(), m, refDevice(t),
		append([]RunnerOption{WithChunkSize(4), WithContextLength(64)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func TestGenerateRejectsBadOptions(t *testing.T) {
	r := synthRunner(t, nil, nil)
	ctx := context.Background()
	for name, opts := range map[string][]GenerateOption{
		"negative max tokens": {WithMaxTokens(-5)},
		"NaN temperature":     {WithSampler(sample.Config{Temperature: float32(math.NaN())})},
		"top-p above 1":       {WithSampler(sample.Config{Temperature: 1, TopP: 2})},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := r.Generate(ctx, "hello", opts...)
			assert.ErrorIs(t, err, core.ErrInvalidArgument)
		})
	}
	res, err := r.Generate(ctx, "hello", WithMaxTokens(0))
	require.NoError(t, err, "0 tokens only prefills")
	assert.Empty(t, res.Tokens)
}

// plant sets element 0 of an f32 tensor to x.
func plant(name string, x float32) func([]gguf.WriteTensor) []gguf.WriteTensor {
	return func(ts []gguf.WriteTensor) []gguf.WriteTensor {
		for i := range ts {
			if ts[i].Name == name {
				xs := core.DecodeF32(ts[i].Data)
				xs[0] = x
				ts[i].Data = core.EncodeF32(xs)
			}
		}
		return ts
	}
}

// TestNonFiniteWeightsFail: before the check, a NaN weight made every logit NaN, greedy
// sampling picked token 0 (a stop token here) and Generate returned empty text and no error.
func TestNonFiniteWeightsFail(t *testing.T) {
	ctx := context.Background()
	for _, x := range []float32{float32(math.NaN()), float32(math.Inf(1))} {
		t.Run("default check/"+fmt.Sprint(x), func(t *testing.T) {
			r := synthRunner(t, nil, plant("blk.2.ffn_down.weight", x))
			res, err := r.Generate(ctx, "hello", WithMaxTokens(8))
			require.ErrorIs(t, err, ErrNonFinite)
			assert.Contains(t, err.Error(), "logit")
			assert.Contains(t, err.Error(), "WithStageChecks")
			assert.Empty(t, res.Text)
		})
	}
	t.Run("stage checks name the first bad layer", func(t *testing.T) {
		r := synthRunner(t, nil, plant("blk.2.ffn_down.weight", float32(math.NaN())), WithStageChecks())
		_, err := r.Generate(ctx, "hello", WithMaxTokens(8))
		require.ErrorIs(t, err, ErrNonFinite)
		assert.Contains(t, err.Error(), "stage 3 (layer 2)")
		assert.Contains(t, err.Error(), "output x (")
	})
	t.Run("stage checks on the embedding", func(t *testing.T) {
		r := synthRunner(t, nil, plant("token_embd.weight", float32(math.Inf(-1))), WithStageChecks())
		// token 0's embedding row holds the infinity; BOS (1) and then id 0 is in "<unk>"
		_, err := r.Prefill(ctx, []int32{1, 0})
		require.ErrorIs(t, err, ErrNonFinite)
		assert.Contains(t, err.Error(), "stage 0 (embedding")
	})
	t.Run("stage checks pass a healthy model", func(t *testing.T) {
		r := synthRunner(t, nil, nil, WithStageChecks())
		_, err := r.Generate(ctx, "hello", WithMaxTokens(4))
		require.NoError(t, err)
	})
}

func TestNonFiniteHyperparametersRejected(t *testing.T) {
	cases := []struct {
		key string
		v   float32
	}{
		{"llama.attention.layer_norm_rms_epsilon", float32(math.NaN())},
		{"llama.attention.layer_norm_rms_epsilon", float32(math.Inf(1))},
		{"llama.attention.layer_norm_rms_epsilon", -1e-5},
		{"llama.rope.freq_base", float32(math.NaN())},
		{"llama.rope.freq_base", 0},
		{"llama.rope.scaling.factor", float32(math.Inf(1))},
		{"llama.rope.scaling.factor", -2},
	}
	for _, c := range cases {
		t.Run(c.key+"="+fmt.Sprint(c.v), func(t *testing.T) {
			_, err := FromFile(rewrite(t, setKV(c.key, c.v), nil))
			require.ErrorIs(t, err, core.ErrInvalidArgument)
			assert.Contains(t, err.Error(), c.key)
		})
	}
	m, err := FromFile(rewrite(t, setKV("llama.rope.scaling.factor", float32(0)), nil))
	require.NoError(t, err, "llama.cpp reads a scaling factor of 0 as none")
	assert.Equal(t, float32(1), m.Config.RopeFreqScale)
}

// TestSpecialIDOutsideTheVocabulary: an out-of-range BOS used to be dropped, so the file was
// reported as having "no BOS token".
func TestSpecialIDOutsideTheVocabulary(t *testing.T) {
	for _, key := range []string{"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"} {
		_, err := FromFile(rewrite(t, setKV(key, uint32(9999)), nil))
		require.ErrorIs(t, err, core.ErrInvalidArgument)
		assert.Contains(t, err.Error(), key+" = 9999")
	}
}

// TestPaddedEmbeddingNeverSampled: a vocabulary of 300 tokens over 512 embedding rows (padding
// some conversions add). At temperature 100 sampling is nearly uniform over the logits it is
// given, so before the fix about 40 % of the draws were padding ids, which decode to "".
func TestPaddedEmbeddingNeverSampled(t *testing.T) {
	const n = 300
	truncate := func(kvs []gguf.KeyValue) []gguf.KeyValue {
		for i := range kvs {
			switch kvs[i].Key {
			case "tokenizer.ggml.tokens":
				xs, _ := kvs[i].Value.Strings()
				kvs[i].Value = gguf.MustValue(xs[:n])
			case "tokenizer.ggml.scores":
				xs, _ := kvs[i].Value.Float32s()
				kvs[i].Value = gguf.MustValue(xs[:n])
			case "tokenizer.ggml.token_type":
				xs, _ := kvs[i].Value.Ints()
				ts := make([]int32, n)
				for j := range ts {
					ts[j] = int32(xs[j])
				}
				kvs[i].Value = gguf.MustValue(ts)
			}
		}
		return kvs
	}
	r := synthRunner(t, truncate, nil)
	require.Equal(t, 512, r.Model().Config.Vocab)
	require.Equal(t, n, r.Model().Tokenizer.Size())
	res, err := r.Generate(context.Background(), "hello", WithMaxTokens(48),
		WithSampler(sample.Config{Temperature: 100, Seed: 3}))
	require.NoError(t, err)
	require.NotEmpty(t, res.Tokens)
	for _, id := range res.Tokens {
		assert.Less(t, id, int32(n), "a padding row was sampled")
	}
}
