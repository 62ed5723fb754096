package synth

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/gguf"
)

// The tensors and keys each architecture's file holds are the ones llama.cpp's loader reads
// for it (src/llama-load-tensors.cpp, src/llama-hparams.cpp): layer 0's tensors, the global
// ones and the architecture's own keys.
func TestArchFilesFollowLlamaCpp(t *testing.T) {
	layer := func(names ...string) []string { return names }
	std := layer("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
	for _, c := range []struct {
		variant, arch string
		global        []string
		layer0        []string
		keys          []string
	}{
		{"llama", "llama", []string{"output"}, std, nil},
		{"llama3", "llama", []string{"output", "rope_freqs"}, std, nil},
		{"mistral", "llama", []string{"output"}, std, []string{"attention.sliding_window"}},
		{"qwen2", "qwen2", []string{"output"}, append(std, "attn_q.bias", "attn_k.bias", "attn_v.bias"), nil},
		{"qwen3", "qwen3", []string{"output"}, append(std, "attn_q_norm", "attn_k_norm"),
			[]string{"attention.key_length", "attention.value_length"}},
		{"phi3", "phi3", []string{"output", "rope_factors_long", "rope_factors_short"},
			layer("attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down"),
			[]string{"attention.sliding_window", "rope.scaling.original_context_length", "rope.scaling.attn_factor"}},
		{"gemma2", "gemma2", nil, append(std, "post_attention_norm", "post_ffw_norm"),
			[]string{"attention.sliding_window", "attn_logit_softcapping", "final_logit_softcapping", "attention.key_length"}},
		{"gemma3", "gemma3", nil, append(std, "attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"),
			[]string{"attention.sliding_window", "attention.key_length"}},
		{"smollm3", "smollm3", []string{"output"}, std, nil},
		{"granite", "granite", nil, std, []string{"embedding_scale", "residual_scale", "logit_scale", "attention.scale"}},
	} {
		t.Run(c.variant, func(t *testing.T) {
			s, err := Preset(c.variant, "260K", core.F32, 1)
			require.NoError(t, err)
			f, err := gguf.Parse(write(t, s))
			require.NoError(t, err)
			av, _ := f.Get("general.architecture")
			assert.Equal(t, c.arch, av.Any())
			want := []string{"token_embd.weight", "output_norm.weight"}
			for _, g := range c.global {
				want = append(want, g+".weight")
			}
			for _, n := range c.layer0 {
				if !slices.Contains([]string{"attn_q.bias", "attn_k.bias", "attn_v.bias"}, n) {
					n += ".weight"
				}
				want = append(want, "blk.0."+n)
			}
			var got []string
			var params int64
			for _, ti := range f.Tensors {
				params += ti.Shape.NumElements()
				if _, err := fmt.Sscanf(ti.Name, "blk.%d.", new(int)); err == nil && ti.Name[:6] != "blk.0." {
					continue
				}
				got = append(got, ti.Name)
			}
			assert.ElementsMatch(t, want, got)
			assert.Equal(t, s.Params(), params-extraParams(f), "Params counts every weight")
			for _, k := range append(c.keys, "context_length", "embedding_length", "block_count", "feed_forward_length",
				"attention.head_count", "attention.head_count_kv", "rope.dimension_count", "rope.freq_base",
				"attention.layer_norm_rms_epsilon") {
				_, ok := f.Get(c.arch + "." + k)
				assert.True(t, ok, "%s.%s", c.arch, k)
			}
		})
	}
}

// extraParams are the RoPE factor tensors, which Params leaves out (they are not weights).
func extraParams(f *gguf.File) int64 {
	var n int64
	for _, name := range []string{"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"} {
		if ti, ok := f.Tensor(name); ok {
			n += ti.Shape.NumElements()
		}
	}
	return n
}

// Every architecture's quantized file loads and generates on the reference backend.
func TestArchFilesRunQuantized(t *testing.T) {
	for _, v := range Architectures() {
		t.Run(v, func(t *testing.T) {
			s, err := Preset(v, "260K", core.Q8_0, 3)
			require.NoError(t, err)
			s.Layers = min(s.Layers, 6)
			f, err := gguf.Parse(write(t, s))
			require.NoError(t, err)
			m, err := llm.FromFile(f)
			require.NoError(t, err)
			b := ref.New()
			defer b.Close()
			r, err := llm.NewRunner(context.Background(), m, b.Devices()[0], llm.WithChunkSize(8), llm.WithContextLength(256))
			require.NoError(t, err)
			defer r.Close()
			res, err := r.Generate(context.Background(), "hello world, the cat sat on the mat", llm.WithMaxTokens(4))
			require.NoError(t, err)
			assert.NotEmpty(t, res.Tokens)
		})
	}
}

func TestArchSpecErrors(t *testing.T) {
	_, err := Preset("mamba", "260K", core.F32, 0)
	require.ErrorIs(t, err, core.ErrUnsupported)
	assert.Contains(t, err.Error(), "gemma2, gemma3, granite, llama, llama3, mistral, phi3, qwen2, qwen3, smollm3")
	s, err := Preset("gemma2", "260K", core.F32, 0)
	require.NoError(t, err)
	assert.Equal(t, 26, s.Layers, "ik_llama.cpp's Gemma 2 knows 26, 42 and 46 layers")
	s.Sparsity = 0.5
	assert.ErrorIs(t, Check(s), core.ErrUnsupported)
	s, _ = Preset("qwen3", "260K", core.F32, 0)
	s.RopeDims = 3
	assert.ErrorIs(t, Check(s), core.ErrInvalidArgument)
	s, _ = Preset("qwen2", "260K", core.F32, 0)
	s.RopeFreqs = true
	assert.ErrorIs(t, Check(s), core.ErrInvalidArgument)
}
