// Package llm runs Llama-family language models (llama: TinyStories, TinyLlama, Llama 2/3;
// qwen2) from GGUF files on any xpu backend: the graph builder, a KV cache in backend buffers,
// chunked prefill with graphs prepared once per chunk length, the decode loop and sampling.
//
// Load is the short way in: it opens a model, chooses the best usable device and returns an
// Engine ready to Generate or start a Chat (which renders the model's chat template). Open,
// NewRunner and a device from package loader do the same step by step.
package llm

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/tokenizer"
)

// Model is a loaded GGUF model: its shape, tokenizer and weights (mapped from the file).
type Model struct {
	Config    Config
	Tokenizer *tokenizer.Tokenizer
	File      *gguf.File
	weights   map[string]weight
	owned     bool
	columnCache
}

// weight is a tensor ready to become a graph constant.
type weight struct {
	dtype core.DType
	shape core.Shape
	data  []byte
}

// Open maps a GGUF file and loads the model in it.
func Open(path string) (*Model, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	m, err := FromFile(f)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	m.owned = true
	return m, nil
}

// FromFile loads the model of an already parsed file; the file must outlive the model.
func FromFile(f *gguf.File) (*Model, error) {
	if f.BigEndian {
		return nil, fmt.Errorf("llm: big-endian tensor data: %w", core.ErrUnsupported)
	}
	cfg, err := ConfigFromGGUF(f)
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, err
	}
	m := &Model{Config: cfg, Tokenizer: tok, File: f, weights: map[string]weight{}}
	if err := m.collect(); err != nil {
		return nil, err
	}
	return m, nil
}

// Close releases the file when the model opened it.
func (m *Model) Close() error {
	if m.owned {
		return m.File.Close()
	}
	return nil
}

// WeightBytes is the size of every weight the model reads per token (all but the embedding).
func (m *Model) WeightBytes() int64 {
	var n int64
	for name, w := range m.weights {
		if name != "token_embd.weight" || m.weights["output.weight"].data == nil {
			n += int64(len(w.data))
		}
	}
	return n
}

// collect checks every tensor the architecture needs, with the shape it must have.
func (m *Model) collect() error {
	c := m.Config
	kvDim := c.KVHeads * c.HeadDim
	emb, ok := m.File.Tensor("token_embd.weight")
	if !ok {
		return fmt.Errorf("llm: tensor token_embd.weight: %w", core.ErrNotFound)
	}
	if len(emb.Shape) != 2 || emb.Shape[1] != int64(c.Dim) {
		return fmt.Errorf("llm: token_embd.weight is %s, want [vocab, %d]: %w", emb.Shape, c.Dim, core.ErrInvalidArgument)
	}
	m.Config.Vocab = int(emb.Shape[0])
	// Some conversions pad the embedding past the vocabulary (rows no text encodes to); fewer
	// rows than tokens would let the tokenizer produce ids the model cannot embed.
	if m.Config.Vocab < m.Tokenizer.Size() {
		return fmt.Errorf("llm: %d embeddings for %d tokens: %w", m.Config.Vocab, m.Tokenizer.Size(), core.ErrInvalidArgument)
	}
	if t, ok := m.File.Tensor("rope_freqs.weight"); ok {
		if want := (core.Shape{int64(c.RopeDims / 2)}); !t.Shape.Equal(want) {
			return fmt.Errorf("llm: tensor rope_freqs.weight is %s, want %s: %w", t.Shape, want, core.ErrInvalidArgument)
		}
		f, err := core.Dequantize(t.DType, m.File.TensorData(t), 0)
		if err != nil {
			return fmt.Errorf("llm: tensor rope_freqs.weight: %w", err)
		}
		for i, x := range f {
			if !(x > 0) {
				return fmt.Errorf("llm: rope_freqs.weight[%d] = %g must be positive: %w", i, x, core.ErrInvalidArgument)
			}
		}
		m.Config.RopeFreqFactors = f
	}
	V, D, F := int64(m.Config.Vocab), int64(c.Dim), int64(c.FFN)
	type spec struct {
		name     string
		shape    core.Shape
		optional bool
		vector   bool // a norm weight or bias: used as an f32 operand of ADD/MUL
	}
	specs := []spec{
		{name: "token_embd.weight", shape: core.Shape{V, D}},
		{name: "output_norm.weight", shape: core.Shape{D}, vector: true},
		{name: "output.weight", shape: core.Shape{V, D}, optional: true},
	}
	for l := 0; l < c.Layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		specs = append(specs,
			spec{name: p + "attn_norm.weight", shape: core.Shape{D}, vector: true},
			spec{name: p + "attn_q.weight", shape: core.Shape{int64(c.Heads * c.HeadDim), D}},
			spec{name: p + "attn_k.weight", shape: core.Shape{int64(kvDim), D}},
			spec{name: p + "attn_v.weight", shape: core.Shape{int64(kvDim), D}},
			spec{name: p + "attn_output.weight", shape: core.Shape{D, int64(c.Heads * c.HeadDim)}},
			spec{name: p + "ffn_norm.weight", shape: core.Shape{D}, vector: true},
			spec{name: p + "ffn_gate.weight", shape: core.Shape{F, D}},
			spec{name: p + "ffn_up.weight", shape: core.Shape{F, D}},
			spec{name: p + "ffn_down.weight", shape: core.Shape{D, F}},
		)
		if c.QKVBias {
			specs = append(specs,
				spec{name: p + "attn_q.bias", shape: core.Shape{int64(c.Heads * c.HeadDim)}, vector: true},
				spec{name: p + "attn_k.bias", shape: core.Shape{int64(kvDim)}, vector: true},
				spec{name: p + "attn_v.bias", shape: core.Shape{int64(kvDim)}, vector: true})
		}
	}
	for _, s := range specs {
		t, ok := m.File.Tensor(s.name)
		if !ok {
			if s.optional {
				continue
			}
			return fmt.Errorf("llm: tensor %s: %w", s.name, core.ErrNotFound)
		}
		if !t.Shape.Equal(s.shape) {
			return fmt.Errorf("llm: tensor %s is %s, want %s: %w", s.name, t.Shape, s.shape, core.ErrInvalidArgument)
		}
		if t.DType == core.I8 {
			// GGUF's I8 has no scale to dequantize with (xpu's NPU int8 weights are a companion
			// layout next to the original, llm/w8a8)
			return fmt.Errorf("llm: tensor %s is I8, which has no scale in GGUF: %w", s.name, core.ErrUnsupported)
		}
		w := weight{dtype: t.DType, shape: t.Shape, data: m.File.TensorData(t)}
		if s.vector && w.dtype != core.F32 {
			// Norm weights and biases are elementwise operands, which must match the f32
			// activations; they are tiny, so a converted copy costs nothing.
			xs, err := core.Dequantize(w.dtype, w.data, 0)
			if err != nil {
				return fmt.Errorf("llm: tensor %s: %w", s.name, err)
			}
			w = weight{dtype: core.F32, shape: t.Shape, data: core.EncodeF32(xs)}
		}
		m.weights[s.name] = w
	}
	return nil
}

// w returns a weight as a constant of g, or the tied embedding for a missing output head.
func (m *Model) w(g *core.Graph, name string) *core.Tensor {
	w, ok := m.weights[name]
	if !ok && name == "output.weight" {
		w = m.weights["token_embd.weight"]
	}
	return g.Const(name, w.dtype, w.shape, w.data)
}
