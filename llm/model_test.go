package llm

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/synth"
)

// rewrite regenerates a small synthetic model with edited metadata and tensors.
func rewrite(t *testing.T, editKV func([]gguf.KeyValue) []gguf.KeyValue, editT func([]gguf.WriteTensor) []gguf.WriteTensor) *gguf.File {
	spec, err := synth.Preset("llama", "260K", core.F32, 3)
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, synth.Write(&buf, spec))
	f, err := gguf.Parse(buf.Bytes())
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
	buf.Reset()
	require.NoError(t, gguf.Write(&buf, kvs, ts))
	out, err := gguf.Parse(buf.Bytes())
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
		{"rope factors", nil, addRopeFreqs, core.ErrUnsupported, "rope_freqs"},
		{"tokenizer", setKV("tokenizer.ggml.model", "bert"), nil, core.ErrUnsupported, `"bert"`},
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
		NormEps: 1e-5, Vocab: 512}, c)
}
