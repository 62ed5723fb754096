// Package synth writes synthetic Llama-family GGUF models: the shape of a real model, seeded
// random weights and a small SentencePiece-style vocabulary. They follow llama.cpp's metadata
// conventions, so GGUF readers load them, and serve benchmarks and tests where a real model of
// that size is not at hand.
package synth

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
)

// Spec is the model to write.
type Spec struct {
	Arch    string // "llama" or "qwen2" (adds QKV biases; NeoX RoPE is implied by the arch)
	Name    string
	Dim     int
	Layers  int
	Heads   int
	KVHeads int
	FFN     int
	Vocab   int // at least 259 (3 specials and 256 byte tokens)
	Context int
	// Type is the dtype of the matrices (F32, F16, BF16, Q8_0, Q4_0, a K-quant); norms stay F32.
	Type core.DType
	Seed uint64
	// Activation is the FFN activation written to <arch>.feed_forward_activation ("relu",
	// "relu2"); "" or "silu" writes no key (llama.cpp's default SwiGLU). It never changes a
	// tensor: a ReLU model and its SiLU twin of the same seed hold identical weights. (The key
	// is llm.ActivationKey, spelled out here because llm's own tests import this package.)
	Activation string
}

// presets are shapes of well-known models (vocabulary kept small).
var presets = map[string]Spec{
	"260K": {Dim: 64, Layers: 5, Heads: 8, KVHeads: 4, FFN: 192, Context: 512},
	"6M":   {Dim: 256, Layers: 8, Heads: 8, KVHeads: 2, FFN: 768, Context: 512}, // K-quant sized: every row a multiple of 256
	"15M":  {Dim: 288, Layers: 6, Heads: 6, KVHeads: 6, FFN: 768, Context: 256},
	"110M": {Dim: 768, Layers: 12, Heads: 12, KVHeads: 12, FFN: 2048, Context: 1024},
	"1B":   {Dim: 2048, Layers: 16, Heads: 32, KVHeads: 8, FFN: 8192, Context: 4096},   // Llama 3.2 1B
	"3B":   {Dim: 3072, Layers: 28, Heads: 24, KVHeads: 8, FFN: 8192, Context: 4096},   // Llama 3.2 3B
	"7B":   {Dim: 4096, Layers: 32, Heads: 32, KVHeads: 32, FFN: 11008, Context: 4096}, // Llama 2 7B
}

// Presets lists the preset names, smallest first.
func Presets() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	sort.Slice(names, func(a, b int) bool { return presets[names[a]].Dim < presets[names[b]].Dim })
	return names
}

// Preset returns the spec of a named size ("1B") for arch with matrices in dt.
func Preset(arch, params string, dt core.DType, seed uint64) (Spec, error) {
	s, ok := presets[strings.ToUpper(params)]
	if !ok {
		return Spec{}, fmt.Errorf("synth: size %q (known: %s): %w", params, strings.Join(Presets(), ", "), core.ErrNotFound)
	}
	s.Arch, s.Type, s.Seed, s.Vocab = arch, dt, seed, 512
	s.Name = fmt.Sprintf("synthetic-%s-%s-%s", arch, params, dt)
	return s, s.check()
}

func (s Spec) check() error {
	switch {
	case s.Arch != "llama" && s.Arch != "qwen2":
		return fmt.Errorf("synth: architecture %q (llama, qwen2): %w", s.Arch, core.ErrUnsupported)
	case s.Dim <= 0 || s.Layers <= 0 || s.Heads <= 0 || s.KVHeads <= 0 || s.FFN <= 0 || s.Context <= 0:
		return fmt.Errorf("synth: every dimension must be positive: %w", core.ErrInvalidArgument)
	case s.Dim%s.Heads != 0 || s.Heads%s.KVHeads != 0:
		return fmt.Errorf("synth: dim %d, %d heads, %d kv heads do not divide: %w", s.Dim, s.Heads, s.KVHeads, core.ErrInvalidArgument)
	case s.Activation != "" && s.Activation != "silu" && s.Activation != "relu" && s.Activation != "relu2":
		return fmt.Errorf("synth: activation %q (silu, relu, relu2): %w", s.Activation, core.ErrInvalidArgument)
	case s.Vocab < 259:
		return fmt.Errorf("synth: vocabulary %d < 259: %w", s.Vocab, core.ErrInvalidArgument)
	}
	if _, err := gguf.TypeOf(s.Type); err != nil {
		return err
	}
	if bl := s.Type.BlockLen(); int64(s.Dim)%bl != 0 || int64(s.FFN)%bl != 0 {
		return fmt.Errorf("synth: dim %d and ffn %d must be multiples of %d for %s: %w", s.Dim, s.FFN, bl, s.Type, core.ErrInvalidArgument)
	}
	return nil
}

// Params is the number of weights.
func (s Spec) Params() int64 {
	d, f, kv := int64(s.Dim), int64(s.FFN), int64(s.Dim/s.Heads*s.KVHeads)
	perLayer := 2*d*d + 2*d*kv + 3*d*f + 2*d
	return int64(s.Layers)*perLayer + 2*int64(s.Vocab)*d + d
}

// fileType is llama.cpp's general.file_type (enum llama_ftype) for a dtype.
func fileType(dt core.DType) uint32 {
	switch dt {
	case core.F16:
		return 1
	case core.Q4_0:
		return 2
	case core.Q8_0:
		return 7
	case core.BF16:
		return 32
	}
	return 0
}

// Write writes the model. Tensors are generated one at a time, so memory stays at one tensor.
func Write(w io.Writer, s Spec) error {
	if err := s.check(); err != nil {
		return err
	}
	tokens, scores, types := vocabulary(s.Vocab)
	a := s.Arch
	kvs := []gguf.KeyValue{
		{Key: "general.architecture", Value: gguf.MustValue(a)},
		{Key: "general.name", Value: gguf.MustValue(s.Name)},
		{Key: "general.file_type", Value: gguf.MustValue(fileType(s.Type))},
		{Key: "general.quantization_version", Value: gguf.MustValue(uint32(2))},
		{Key: a + ".vocab_size", Value: gguf.MustValue(uint32(s.Vocab))},
		{Key: a + ".context_length", Value: gguf.MustValue(uint32(s.Context))},
		{Key: a + ".embedding_length", Value: gguf.MustValue(uint32(s.Dim))},
		{Key: a + ".block_count", Value: gguf.MustValue(uint32(s.Layers))},
		{Key: a + ".feed_forward_length", Value: gguf.MustValue(uint32(s.FFN))},
		{Key: a + ".attention.head_count", Value: gguf.MustValue(uint32(s.Heads))},
		{Key: a + ".attention.head_count_kv", Value: gguf.MustValue(uint32(s.KVHeads))},
		{Key: a + ".rope.dimension_count", Value: gguf.MustValue(uint32(s.Dim / s.Heads))},
		{Key: a + ".rope.freq_base", Value: gguf.MustValue(float32(10000))},
		{Key: a + ".attention.layer_norm_rms_epsilon", Value: gguf.MustValue(float32(1e-5))},
		{Key: "tokenizer.ggml.model", Value: gguf.MustValue("llama")},
	}
	if s.Activation != "" && s.Activation != "silu" {
		kvs = append(kvs, gguf.KeyValue{Key: a + ".feed_forward_activation", Value: gguf.MustValue(s.Activation)})
	}
	kvs = append(kvs, []gguf.KeyValue{
		{Key: "tokenizer.ggml.tokens", Value: gguf.MustValue(tokens)},
		{Key: "tokenizer.ggml.scores", Value: gguf.MustValue(scores)},
		{Key: "tokenizer.ggml.token_type", Value: gguf.MustValue(types)},
		{Key: "tokenizer.ggml.unknown_token_id", Value: gguf.MustValue(uint32(0))},
		{Key: "tokenizer.ggml.bos_token_id", Value: gguf.MustValue(uint32(1))},
		{Key: "tokenizer.ggml.eos_token_id", Value: gguf.MustValue(uint32(2))},
		{Key: "tokenizer.ggml.add_bos_token", Value: gguf.MustValue(true)},
	}...)
	V, D, F := int64(s.Vocab), int64(s.Dim), int64(s.FFN)
	HD := D / int64(s.Heads)
	KV := HD * int64(s.KVHeads)
	var ts []gguf.WriteTensor
	seq := uint64(0)
	add := func(name string, dt core.DType, shape core.Shape, gen func(n int, rng *rand.Rand) []float32) {
		seq++
		rng := rand.New(rand.NewPCG(s.Seed, seq)) // each tensor its own stream: order-independent
		ts = append(ts, gguf.WriteTensor{Name: name, DType: dt, Shape: shape, Gen: func() ([]byte, error) {
			return core.Quantize(dt, gen(int(shape.NumElements()), rng), 0)
		}})
	}
	// Uniform in ±√3σ has standard deviation σ; σ = 1/√fan_in keeps activations of a random
	// network at unit scale through every layer.
	matrix := func(fanIn int64) func(int, *rand.Rand) []float32 {
		lim := float32(math.Sqrt(3 / float64(fanIn)))
		return func(n int, rng *rand.Rand) []float32 {
			xs := make([]float32, n)
			for i := range xs {
				xs[i] = (rng.Float32()*2 - 1) * lim
			}
			return xs
		}
	}
	ones := func(n int, _ *rand.Rand) []float32 {
		xs := make([]float32, n)
		for i := range xs {
			xs[i] = 1
		}
		return xs
	}
	add("token_embd.weight", s.Type, core.Shape{V, D}, matrix(1))
	add("output_norm.weight", core.F32, core.Shape{D}, ones)
	add("output.weight", s.Type, core.Shape{V, D}, matrix(D))
	for l := 0; l < s.Layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		add(p+"attn_norm.weight", core.F32, core.Shape{D}, ones)
		add(p+"attn_q.weight", s.Type, core.Shape{D, D}, matrix(D))
		add(p+"attn_k.weight", s.Type, core.Shape{KV, D}, matrix(D))
		add(p+"attn_v.weight", s.Type, core.Shape{KV, D}, matrix(D))
		if s.Arch == "qwen2" {
			add(p+"attn_q.bias", core.F32, core.Shape{D}, matrix(D))
			add(p+"attn_k.bias", core.F32, core.Shape{KV}, matrix(D))
			add(p+"attn_v.bias", core.F32, core.Shape{KV}, matrix(D))
		}
		add(p+"attn_output.weight", s.Type, core.Shape{D, D}, matrix(D))
		add(p+"ffn_norm.weight", core.F32, core.Shape{D}, ones)
		add(p+"ffn_gate.weight", s.Type, core.Shape{F, D}, matrix(D))
		add(p+"ffn_up.weight", s.Type, core.Shape{F, D}, matrix(D))
		add(p+"ffn_down.weight", s.Type, core.Shape{D, F}, matrix(F))
	}
	return gguf.Write(w, kvs, ts)
}

// vocabulary is <unk> <s> </s>, the 256 byte tokens, then pieces (▁, printable ASCII, ▁ plus
// a letter, frequent English pairs) up to n, scored so that longer pieces merge first.
func vocabulary(n int) ([]string, []float32, []int32) {
	tokens := []string{"<unk>", "<s>", "</s>"}
	types := []int32{2, 3, 3}
	for b := 0; b < 256; b++ {
		tokens = append(tokens, fmt.Sprintf("<0x%02X>", b))
		types = append(types, 6)
	}
	seen := map[string]bool{}
	var pieces []string
	addPiece := func(p string) {
		if !seen[p] {
			seen[p] = true
			pieces = append(pieces, p)
		}
	}
	addPiece("▁")
	for c := '!'; c <= '~'; c++ {
		addPiece(string(c))
	}
	for c := 'a'; c <= 'z'; c++ {
		addPiece("▁" + string(c))
	}
	const letters = "etaoinshrdlucmfwypvbgkqjxz"
	for _, a := range letters {
		for _, b := range letters {
			addPiece(string(a) + string(b))
		}
	}
	for i := 0; len(tokens) < n; i++ {
		if i < len(pieces) {
			tokens = append(tokens, pieces[i])
		} else {
			tokens = append(tokens, fmt.Sprintf("<extra_%d>", i))
		}
		types = append(types, 1)
	}
	tokens, types = tokens[:n], types[:n]
	scores := make([]float32, n)
	for i := 259; i < n; i++ {
		scores[i] = float32(len([]rune(tokens[i]))) - float32(i)/float32(n)
	}
	return tokens, scores, types
}
