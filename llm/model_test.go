package llm

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/synth"
)

// rewrite regenerates a small synthetic model with edited metadata and tensors.
func rewrite(t *testing.T, editKV func([]gguf.KeyValue) []gguf.KeyValue, editT func([]gguf.WriteTensor) []gguf.WriteTensor) *gguf.File {
	return rewriteArch(t, "llama", editKV, editT)
}

func rewriteArch(t *testing.T, arch string, editKV func([]gguf.KeyValue) []gguf.KeyValue, editT func([]gguf.WriteTensor) []gguf.WriteTensor) *gguf.File {
	spec, err := synth.Preset(arch, "260K", core.F32, 3)
	require.NoError(t, err)
	f, err := synth.Parse(spec)
	require.NoError(t, err)
	var ts []gguf.WriteTensor
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		ts = append(ts, gguf.WriteTensor{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, Data: f.TensorData(ti)})
	}
	kvs := append([]gguf.KeyValue(nil), f.KV...)
	if editKV != nil {
		kvs = editKV(kvs)
	}
	if editT != nil {
		ts = editT(ts)
	}
	// A new buffer: the tensors still alias the first one's bytes.
	var out2 bytes.Buffer
	require.NoError(t, gguf.Write(&out2, kvs, ts))
	out, err := gguf.Parse(out2.Bytes())
	require.NoError(t, err)
	return out
}

func setKV(key string, v any) func([]gguf.KeyValue) []gguf.KeyValue {
	return func(kvs []gguf.KeyValue) []gguf.KeyValue {
		for i := range kvs {
			if kvs[i].Key == key {
				kvs[i].Value = gguf.MustValue(v)
				return kvs
			}
		}
		return append(kvs, gguf.KeyValue{Key: key, Value: gguf.MustValue(v)})
	}
}

func TestLoadErrorsNameTheProblem(t *testing.T) {
	drop := func(name string) func([]gguf.WriteTensor) []gguf.WriteTensor {
		return func(ts []gguf.WriteTensor) []gguf.WriteTensor {
			var out []gguf.WriteTensor
			for _, x := range ts {
				if x.Name != name {
					out = append(out, x)
				}
			}
			return out
		}
	}
	addRopeFreqs := func(ts []gguf.WriteTensor) []gguf.WriteTensor {
		return append(ts, gguf.WriteTensor{Name: "rope_freqs.weight", DType: core.F32, Shape: core.Shape{4}, Data: make([]byte, 16)})
	}
	cases := []struct {
		name   string
		kv     func([]gguf.KeyValue) []gguf.KeyValue
		ts     func([]gguf.WriteTensor) []gguf.WriteTensor
		target error
		msg    string
	}{
		{"architecture", setKV("general.architecture", "mamba"), nil, core.ErrUnsupported, `"mamba"`},
		{"missing tensor", nil, drop("blk.3.ffn_up.weight"), core.ErrNotFound, "blk.3.ffn_up.weight"},
		{"heads", setKV("llama.attention.head_count", uint32(7)), nil, core.ErrInvalidArgument, "7 heads"},
		{"rope factors", nil, addRopeFreqs, core.ErrInvalidArgument, "rope_freqs.weight[0]"},
		{"tokenizer", setKV("tokenizer.ggml.model", "t5"), nil, core.ErrUnsupported, `"t5"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := FromFile(rewrite(t, c.kv, c.ts))
			require.ErrorIs(t, err, c.target)
			assert.Contains(t, err.Error(), c.msg)
		})
	}
}

func TestTiedOutputUsesTheEmbedding(t *testing.T) {
	f := rewrite(t, nil, func(ts []gguf.WriteTensor) []gguf.WriteTensor {
		var out []gguf.WriteTensor
		for _, x := range ts {
			if x.Name != "output.weight" {
				out = append(out, x)
			}
		}
		return out
	})
	m, err := FromFile(f)
	require.NoError(t, err)
	g := core.NewGraph()
	w := m.w(g, "output.weight")
	emb, _ := f.Tensor("token_embd.weight")
	assert.Same(t, &f.TensorData(emb)[0], &w.Data[0], "the tied head reads the embedding, not a copy")
}

func TestConfigFromMetadata(t *testing.T) {
	f := rewrite(t, setKV("llama.rope.freq_base", float32(500000)), nil)
	m, err := FromFile(f)
	require.NoError(t, err)
	c := m.Config
	assert.Equal(t, Config{Arch: "llama", ContextLength: 512, Dim: 64, Layers: 5, FFN: 192, Heads: 8,
		KVHeads: 4, HeadDim: 8, RopeDims: 8, RopeBase: 500000, RopeFreqScale: 1, RopeMode: core.RoPENormal,
		NormEps: 1e-5, Vocab: 512, Activation: arch.ActSiLU}, c)
}

// TestRopeFactorsMatchTheRoPEOp: a uniform factor f is the same as a frequency scale of 1/f, so
// the host-table path (taken for rope_freqs.weight) must give the ROPE op's logits, in normal
// and NeoX order and with partial rotary dims.
func TestRopeFactorsMatchTheRoPEOp(t *testing.T) {
	for _, c := range []struct {
		arch string
		dims uint32
	}{{"llama", 8}, {"qwen2", 8}, {"llama", 4}, {"qwen2", 4}} {
		t.Run(fmt.Sprintf("%s-%d", c.arch, c.dims), func(t *testing.T) {
			dims := setKV(c.arch+".rope.dimension_count", c.dims)
			factors := func(ts []gguf.WriteTensor) []gguf.WriteTensor {
				f := make([]float32, c.dims/2)
				for i := range f {
					f[i] = 2
				}
				return append(ts, gguf.WriteTensor{Name: "rope_freqs.weight", DType: core.F32,
					Shape: core.Shape{int64(len(f))}, Data: core.EncodeF32(f)})
			}
			withTables, err := FromFile(rewriteArch(t, c.arch, dims, factors))
			require.NoError(t, err)
			require.Len(t, withTables.Config.RopeFreqFactors, int(c.dims/2))
			withOp, err := FromFile(rewriteArch(t, c.arch, func(kvs []gguf.KeyValue) []gguf.KeyValue {
				return setKV(c.arch+".rope.scaling.factor", float32(2))(dims(kvs))
			}, nil))
			require.NoError(t, err)
			require.Equal(t, float32(0.5), withOp.Config.RopeFreqScale)

			ids := withOp.Tokenizer.Encode("the cat sat on the mat and then it ran away", true)
			logits := func(m *Model) []float32 {
				r, err := NewRunner(context.Background(), m, refDevice(t), WithChunkSize(5), WithContextLength(64),
					WithKVCacheType(core.F32)) // the two RoPE paths' K, not its rounding to F16
				require.NoError(t, err)
				defer r.Close()
				l, err := r.Prefill(context.Background(), ids)
				require.NoError(t, err)
				return l
			}
			assert.InDeltaSlice(t, logits(withOp), logits(withTables), 1e-4)
		})
	}
}
