// Package llm runs decoder-only language models from GGUF files on any xpu backend (llama:
// TinyStories, TinyLlama, Llama 2/3.x, Mistral, SmolLM; qwen2; qwen3; phi3; gemma2; gemma3;
// smollm3, each built by its own builder over shared blocks in package arch): the stage graphs, a KV
// cache in backend buffers, chunked prefill with graphs prepared once per chunk length, the
// decode loop and sampling.
//
// Load is the short way in: it opens a model, chooses the best usable device and returns an
// Engine ready to Generate or start a Chat (which renders the model's chat template). Open,
// NewRunner and a device from package loader do the same step by step.
//
// Techniques live in packages of their own and plug in through the runner's hooks (see
// Runner): speculative decoding (package spec) as a decode Strategy over a VerifyHook's verify
// programs, the sparse FFN (package sparse) as a ChunkHook, the W8A8 lowering and its
// calibration (package w8a8) as a ProjectionHook (a ProjectionReader), decode shards (package
// shard) as a registered StageHook, continuous batching (package batch) as a SequenceHook,
// embeddings (package embed) over the hidden-state output.
package llm

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/tokenizer"
)

// Model is a loaded GGUF model: its shape, tokenizer and weights (mapped from the file).
type Model struct {
	Config    Config
	Tokenizer *tokenizer.Tokenizer
	File      *gguf.File
	weights   map[string]weight
	arch      arch.Builder
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
	cfg, err := arch.ConfigFromGGUF(f)
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, err
	}
	m := &Model{Config: cfg, Tokenizer: tok, File: f, weights: map[string]weight{}}
	m.arch, _ = arch.Lookup(cfg.Arch)
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

// Weight is one of the model's tensors as its stage graphs read it: a view of the file's bytes.
type Weight struct {
	DType core.DType
	Shape core.Shape
	Data  []byte
}

// Weight returns tensor name as the stage graphs read it (after the architecture's row splits;
// norm weights and biases converted to F32), or false when the model has no such tensor.
func (m *Model) Weight(name string) (Weight, bool) {
	w, ok := m.weights[name]
	return Weight{DType: w.dtype, Shape: w.shape, Data: w.data}, ok
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
	V, D := int64(m.Config.Vocab), int64(c.Dim)
	specs := []arch.TensorSpec{
		{Name: "token_embd.weight", Shape: core.Shape{V, D}},
		{Name: "output_norm.weight", Shape: core.Shape{D}, Vector: true},
		{Name: "output.weight", Shape: core.Shape{V, D}, Optional: true},
	}
	for l := 0; l < c.Layers; l++ {
		specs = append(specs, m.arch.Tensors(&m.Config, l)...)
	}
	for _, s := range specs {
		t, ok := m.File.Tensor(s.Name)
		if !ok {
			if s.Optional {
				continue
			}
			return fmt.Errorf("llm: tensor %s: %w", s.Name, core.ErrNotFound)
		}
		if !t.Shape.Equal(s.Shape) {
			return fmt.Errorf("llm: tensor %s is %s, want %s: %w", s.Name, t.Shape, s.Shape, core.ErrInvalidArgument)
		}
		if t.DType == core.I8 {
			// GGUF's I8 has no scale to dequantize with (xpu's NPU int8 weights are a companion
			// layout next to the original, llm/w8a8)
			return fmt.Errorf("llm: tensor %s is I8, which has no scale in GGUF: %w", s.Name, core.ErrUnsupported)
		}
		w := weight{dtype: t.DType, shape: t.Shape, data: m.File.TensorData(t)}
		if s.Vector && w.dtype != core.F32 {
			// Norm weights and biases are elementwise operands, which must match the f32
			// activations; they are tiny, so a converted copy costs nothing.
			xs, err := core.Dequantize(w.dtype, w.data, 0)
			if err != nil {
				return fmt.Errorf("llm: tensor %s: %w", s.Name, err)
			}
			w = weight{dtype: core.F32, shape: t.Shape, data: core.EncodeF32(xs)}
		}
		m.weights[s.Name] = w
	}
	return m.arch.Load(arch.Loader{File: m.File, Config: &m.Config, SplitRows: m.splitRows})
}

// w returns a weight as a constant of g, or the tied embedding for a missing output head.
func (m *Model) w(g *core.Graph, name string) *core.Tensor {
	w, ok := m.weights[name]
	if !ok && name == "output.weight" {
		w = m.weights["token_embd.weight"]
	}
	return g.Const(name, w.dtype, w.shape, w.data)
}

// splitRows replaces the weight name by consecutive row ranges of it, layer l's weights parts
// (views of the same bytes: rows hold whole quantization blocks).
func (m *Model) splitRows(name string, parts []string, l int, rows ...int64) error {
	w := m.weights[name]
	var total int64
	for _, n := range rows {
		total += n
	}
	if len(w.shape) != 2 || total != w.shape[0] {
		return fmt.Errorf("llm: tensor %s is %s, cannot split into rows %v: %w", name, w.shape, rows, core.ErrInternal)
	}
	delete(m.weights, name)
	per := w.dtype.Bytes(w.shape[1])
	r0 := int64(0)
	for i, n := range rows {
		m.weights[arch.LayerName(l, parts[i]+".weight")] = weight{dtype: w.dtype, shape: core.Shape{n, w.shape[1]},
			data: w.data[r0*per : (r0+n)*per]}
		r0 += n
	}
	return nil
}
