// Package synth writes synthetic GGUF models of the architectures xpu builds (llama, qwen2,
// qwen3, phi3, gemma2, gemma3): the shape of a real model, seeded random weights and a small
// SentencePiece-style vocabulary, with the tensor names and metadata keys llama.cpp reads. They follow llama.cpp's metadata
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
	// Arch is general.architecture: llama, qwen2 (QKV biases), qwen3 (Q/K norms), phi3 (fused
	// QKV and gate-up, LongRoPE factors), gemma2 (post-norms, soft-caps, tied head) or gemma3
	// (post-norms, Q/K norms); RoPE's order is implied by it.
	Arch    string
	Name    string
	Dim     int
	Layers  int
	Heads   int
	KVHeads int
	FFN     int
	Vocab   int // at least 259 (3 specials and 256 byte tokens)
	Context int
	// HeadDim is the attention head width (0: Dim/Heads), written as attention.key_length.
	HeadDim int
	// RopeDims is the rotated width of each head (0: all of it).
	RopeDims int
	// RopeBase is rope.freq_base (0: 10000).
	RopeBase float64
	// RopeFreqs writes Llama 3.1's rope_freqs.weight (llama only).
	RopeFreqs bool
	// Window > 0 writes attention.sliding_window.
	Window int
	// Type is the dtype of the matrices (F32, F16, BF16, Q8_0, Q4_0, a K-quant); norms stay F32.
	Type core.DType
	Seed uint64
	// Activation is the FFN activation written to <arch>.feed_forward_activation ("relu",
	// "relu2"); "" or "silu" writes no key (llama.cpp's default SwiGLU). It never changes a
	// tensor: a ReLU model and its SiLU twin of the same seed hold identical weights. (The key
	// is arch.ActivationKey.)
	Activation string
	// Sparsity in (0, 1) shapes the FFN for ReLU-like firing: neuron n of each layer fires
	// (gate > 0) with probability p_n, the p_n drawn by Skew with mean 1 − Sparsity. 0 leaves
	// the plain random model. See sparseShape for the construction; it changes tensors, so a
	// SiLU twin needs the same Sparsity and Skew.
	Sparsity float64
	// Skew is how firing probabilities spread over neurons: "zipf" (p ∝ 1/rank, capped at 0.99:
	// a few hot neurons fire for most tokens, most rarely) or "uniform" (every p = 1 − Sparsity).
	Skew string
	// Outliers plants activation outliers in that many channels (0: none), the way real LLMs
	// show them (mllm-NPU, LLM.int8()): the attn_norm and ffn_norm weights of those channels
	// are scaled by 50–100× (OutlierFactor), so the inputs of the Q/K/V and gate/up
	// projections have a few channels far beyond the rest, and the same input channels of those
	// projections' weights are divided by √factor: the outlier channels carry a large share of
	// each projection (in real models they matter) while the outputs stay at a moderate scale,
	// and their weights stay well within a per-tensor int8 or Q8_0 grid. The channels are the
	// same in every layer.
	Outliers int
}

// OutlierChannels are the channels Write plants outliers in for s (ascending; none when
// s.Outliers is 0): spread over the width, chosen by the seed.
func (s Spec) OutlierChannels() []int {
	if s.Outliers <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(s.Seed, 0x0071e5))
	perm := rng.Perm(s.Dim)[:s.Outliers]
	sort.Ints(perm)
	return perm
}

// OutlierFactor is the scale of outlier channel c's norm weights in layer l: 50 to 100,
// seeded (the same for attn_norm and ffn_norm).
func (s Spec) OutlierFactor(l, c int) float32 {
	rng := rand.New(rand.NewPCG(s.Seed^0x0071e5, uint64(l)<<32|uint64(c)))
	return 50 + 50*rng.Float32()
}

// biasChannels is how many leading channels of the residual stream are held at the constant
// 1 in sparse-shaped models: the gate weights on them act as per-neuron biases. One Q4_0/Q8_0
// block, so quantization keeps the constant exact.
const biasChannels = 32

// FiringProbabilities returns layer-independent-shaped firing probabilities for f neurons with
// the given mean and skew, in a seeded random neuron order (so hot neurons are scattered
// across the matrix, as in a trained model).
func FiringProbabilities(f int, mean float64, skew string, rng *rand.Rand) ([]float64, error) {
	if !(mean > 0 && mean < 1) {
		return nil, fmt.Errorf("synth: firing mean %v outside (0, 1): %w", mean, core.ErrInvalidArgument)
	}
	p := make([]float64, f)
	switch skew {
	case "uniform":
		for i := range p {
			p[i] = mean
		}
	case "zipf", "":
		const pmax = 0.99
		sum := func(c float64) float64 {
			var s float64
			for k := 1; k <= f; k++ {
				s += min(pmax, c/float64(k))
			}
			return s / float64(f)
		}
		lo, hi := 0.0, float64(f)
		for it := 0; it < 100; it++ {
			mid := (lo + hi) / 2
			if sum(mid) < mean {
				lo = mid
			} else {
				hi = mid
			}
		}
		for k := range p {
			p[k] = min(pmax, lo/float64(k+1))
		}
	default:
		return nil, fmt.Errorf("synth: skew %q (zipf, uniform): %w", skew, core.ErrInvalidArgument)
	}
	rng.Shuffle(f, func(i, j int) { p[i], p[j] = p[j], p[i] })
	return p, nil
}

// Gate structure of sparse-shaped models: each gate row is mostly a mix of gateRank shared
// directions of its layer, plus gateNoise of its variance in independent noise. A trained
// LLM's gate pre-activations are similarly predictable from a low-rank view of the input
// (what Deja Vu and PowerInfer's predictors rely on); i.i.d. random rows would make every
// neuron's firing unpredictable except by its frequency.
const (
	gateRank  = 16
	gateNoise = 0.1
)

// lowRankGate rewrites the random gate rows xs ([f, d], σ = 1/√d each) in place: row n becomes
// √(1−gateNoise)·Σ_j c_nj u_j + √gateNoise·(its own values), the u_j unit-norm random directions
// (scaled so u·x has x's per-channel variance), c_nj ~ N(0, 1/gateRank): the variance of a
// row's dot product with x is unchanged.
func lowRankGate(xs []float32, f, d int, seed uint64, layer int) {
	rng := rand.New(rand.NewPCG(seed^0x10a5a4c, uint64(layer)))
	u := make([]float32, gateRank*d)
	for j := 0; j < gateRank; j++ {
		row := u[j*d : (j+1)*d]
		var n2 float64
		for i := range row {
			v := rng.NormFloat64()
			row[i] = float32(v)
			n2 += v * v
		}
		inv := float32(1 / math.Sqrt(n2))
		for i := range row {
			row[i] *= inv
		}
	}
	a, b := float32(math.Sqrt(1-gateNoise)), float32(math.Sqrt(gateNoise))
	cs := float64(1 / math.Sqrt(gateRank))
	c := make([]float32, gateRank)
	for n := 0; n < f; n++ {
		for j := range c {
			c[j] = float32(rng.NormFloat64()*cs) * a
		}
		row := xs[n*d : (n+1)*d]
		for i := range row {
			row[i] *= b
		}
		for j, cj := range c {
			uj := u[j*d : (j+1)*d]
			for i := range row {
				row[i] += cj * uj[i]
			}
		}
	}
}

// probit is the standard normal quantile Φ⁻¹(p).
func probit(p float64) float64 { return math.Sqrt2 * math.Erfinv(2*p-1) }

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

// Preset returns the spec of a named size ("1B") for arch (one of Architectures()) with
// matrices in dt.
func Preset(arch, params string, dt core.DType, seed uint64) (Spec, error) {
	s, ok := presets[strings.ToUpper(params)]
	if !ok {
		return Spec{}, fmt.Errorf("synth: size %q (known: %s): %w", params, strings.Join(Presets(), ", "), core.ErrNotFound)
	}
	v, ok := variants[arch]
	if !ok {
		return Spec{}, fmt.Errorf("synth: architecture %q (%s): %w", arch, strings.Join(Architectures(), ", "), core.ErrUnsupported)
	}
	s.Arch, s.Type, s.Seed, s.Vocab = v.arch, dt, seed, 512
	if v.set != nil {
		v.set(&s)
	}
	s.Name = fmt.Sprintf("synthetic-%s-%s-%s", arch, params, dt)
	return s, s.check()
}

// Check validates a spec (Write does too): a spec edited after Preset, e.g. with Outliers set.
func Check(s Spec) error { return s.check() }

func (s Spec) check() error {
	switch {
	case s.Dim <= 0 || s.Layers <= 0 || s.Heads <= 0 || s.KVHeads <= 0 || s.FFN <= 0 || s.Context <= 0:
		return fmt.Errorf("synth: every dimension must be positive: %w", core.ErrInvalidArgument)
	case s.Dim%s.Heads != 0 || s.Heads%s.KVHeads != 0:
		return fmt.Errorf("synth: dim %d, %d heads, %d kv heads do not divide: %w", s.Dim, s.Heads, s.KVHeads, core.ErrInvalidArgument)
	case s.Activation != "" && s.Activation != "silu" && s.Activation != "relu" && s.Activation != "relu2":
		return fmt.Errorf("synth: activation %q (silu, relu, relu2): %w", s.Activation, core.ErrInvalidArgument)
	case s.Sparsity < 0 || s.Sparsity >= 1 || math.IsNaN(s.Sparsity):
		return fmt.Errorf("synth: sparsity %v outside [0, 1): %w", s.Sparsity, core.ErrInvalidArgument)
	case s.Sparsity > 0 && s.Dim < 2*biasChannels:
		return fmt.Errorf("synth: sparse shaping needs dim ≥ %d, got %d: %w", 2*biasChannels, s.Dim, core.ErrInvalidArgument)
	case s.Vocab < 259:
		return fmt.Errorf("synth: vocabulary %d < 259: %w", s.Vocab, core.ErrInvalidArgument)
	case s.Outliers < 0 || s.Outliers > s.Dim/8:
		return fmt.Errorf("synth: %d outlier channels: must be 0 to dim/8 = %d (outliers are rare): %w",
			s.Outliers, s.Dim/8, core.ErrInvalidArgument)
	}
	if err := s.checkArch(); err != nil {
		return err
	}
	if _, err := gguf.TypeOf(s.Type); err != nil {
		return err
	}
	if s.Type == core.I8 {
		// GGUF's I8 carries no scale: a model's matrices cannot be plain int8 (the NPU int8
		// weights are a companion layout, llm/w8a8)
		return fmt.Errorf("synth: matrix dtype i8 has no scale in GGUF: %w", core.ErrUnsupported)
	}
	if s.Sparsity > 0 {
		if _, err := FiringProbabilities(2, 0.5, s.Skew, rand.New(rand.NewPCG(0, 0))); err != nil {
			return err
		}
	}
	if bl := s.Type.BlockLen(); int64(s.Dim)%bl != 0 || int64(s.FFN)%bl != 0 {
		return fmt.Errorf("synth: dim %d and ffn %d must be multiples of %d for %s: %w", s.Dim, s.FFN, bl, s.Type, core.ErrInvalidArgument)
	}
	if bl, w := s.Type.BlockLen(), int64(s.Heads*s.headDim()); w%bl != 0 {
		return fmt.Errorf("synth: attention width %d must be a multiple of %d for %s: %w", w, bl, s.Type, core.ErrInvalidArgument)
	}
	return nil
}

// Params is the number of weights.
func (s Spec) Params() int64 {
	hd := int64(s.headDim())
	d, f, q, kv := int64(s.Dim), int64(s.FFN), hd*int64(s.Heads), hd*int64(s.KVHeads)
	perLayer := 2*d*q + 2*d*kv + 3*d*f + 2*d
	ft := featuresOf(s.Arch)
	if ft.qkNorm {
		perLayer += 2 * hd
	}
	if ft.bias {
		perLayer += q + 2*kv
	}
	if ft.postNorms {
		perLayer += 2 * d
	}
	heads := int64(2)
	if ft.tied {
		heads = 1
	}
	return int64(s.Layers)*perLayer + heads*int64(s.Vocab)*d + d
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
	if s.Arch == "phi3" && len(tokens) > 259 {
		// llama.cpp's vocab loader looks <|endoftext|> up by its text in a phi3 file (as the real
		// Phi-3 vocabulary has it after the SentencePiece pieces) and refuses a file without it
		n := len(tokens) - 1
		tokens[n], scores[n], types[n] = "<|endoftext|>", 0, 3
	}
	a := s.Arch
	base := s.RopeBase
	if base == 0 {
		base = 10000
	}
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
		{Key: a + ".rope.dimension_count", Value: gguf.MustValue(uint32(s.ropeDims()))},
		{Key: a + ".rope.freq_base", Value: gguf.MustValue(float32(base))},
		{Key: a + ".attention.layer_norm_rms_epsilon", Value: gguf.MustValue(float32(1e-5))},
		{Key: "tokenizer.ggml.model", Value: gguf.MustValue("llama")},
	}
	if s.Activation != "" && s.Activation != "silu" {
		kvs = append(kvs, gguf.KeyValue{Key: a + ".feed_forward_activation", Value: gguf.MustValue(s.Activation)})
	}
	kvs = append(kvs, archKeys(s)...)
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
	HD := int64(s.headDim())
	Q, KV := HD*int64(s.Heads), HD*int64(s.KVHeads)
	ft := featuresOf(s.Arch)
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
	outl := s.OutlierChannels()
	// norm is layer l's RMSNorm weight: ones, with the outlier channels at their factor.
	norm := func(l int) func(int, *rand.Rand) []float32 {
		return func(n int, rng *rand.Rand) []float32 {
			xs := ones(n, rng)
			for _, c := range outl {
				xs[c] = s.OutlierFactor(l, c)
			}
			return xs
		}
	}
	sp := s.Sparsity > 0
	// sparseShape: the embedding holds channels [0, biasChannels) at 1 for every token and no
	// layer writes them (their rows of attn_output and ffn_down are 0), so after each RMSNorm
	// they are ≈ 1/rms of the residual for every token. A gate row's weights there then add
	// a per-neuron bias b_n = Φ⁻¹(p_n)·σ to a pre-activation whose random part is ≈ N(0, σ²),
	// σ ≈ 1, making the neuron fire with probability ≈ p_n. Residual-writing matrices are
	// scaled by 1/√(2L) (GPT-2's init) so the residual's rms, which divides the bias, stays
	// near 1 through depth. The achieved sparsity is measured, not assumed (xpu gen-model
	// prints it).
	resScale := float32(1)
	if sp {
		resScale = float32(1 / math.Sqrt(2*float64(s.Layers)))
	}
	residual := func(fanIn int64) func(int, *rand.Rand) []float32 {
		base := matrix(fanIn)
		return func(n int, rng *rand.Rand) []float32 {
			xs := base(n, rng)
			if !sp {
				return xs
			}
			for i := range xs {
				xs[i] *= resScale
			}
			cols := int64(n) / D
			for i := range xs[:biasChannels*cols] { // rows [0, biasChannels): output channels
				xs[i] = 0
			}
			return xs
		}
	}
	// reading wraps gen, a matrix [N, D] that reads a normed input: the outlier columns divided by
	// √factor.
	reading := func(l int, gen func(int, *rand.Rand) []float32) func(int, *rand.Rand) []float32 {
		return func(n int, rng *rand.Rand) []float32 {
			xs := gen(n, rng)
			for _, c := range outl {
				f := float32(math.Sqrt(float64(s.OutlierFactor(l, c))))
				for i := c; i < n; i += int(D) {
					xs[i] /= f
				}
			}
			return xs
		}
	}
	// Gemma and Granite multiply their embeddings (by √dim, by 12) and tie the head to them:
	// rows of σ = 1/√dim keep the residual near the scale other models' rows of σ = 1 give.
	embFanIn := int64(1)
	if ft.tied {
		embFanIn = D
	}
	embed := func(n int, rng *rand.Rand) []float32 {
		xs := matrix(embFanIn)(n, rng)
		if sp {
			for r := 0; r < n/int(D); r++ {
				for c := 0; c < biasChannels; c++ {
					xs[r*int(D)+c] = 1
				}
			}
		}
		return xs
	}
	gateOf := func(l int) func(int, *rand.Rand) []float32 {
		base := matrix(D)
		return func(n int, rng *rand.Rand) []float32 {
			xs := base(n, rng)
			if !sp {
				return xs
			}
			prng := rand.New(rand.NewPCG(s.Seed^0x5eed5eed, uint64(l)))
			probs, err := FiringProbabilities(int(F), 1-s.Sparsity, s.Skew, prng)
			if err != nil {
				panic(err) // checked by Spec.check
			}
			// The constant channels' value after RMSNorm: 1/rms, the rms growing slowly
			// with depth (measured on generated models: ≈ √(1 + 0.5·l/L)).
			xc := 1 / math.Sqrt(1+0.5*float64(l)/float64(s.Layers))
			// The random part's σ: the normalized vector has Σx² = D, of which the constant
			// channels take biasChannels·xc², and each weight has variance 1/D.
			sigma := math.Sqrt((float64(D) - biasChannels*xc*xc) / float64(D))
			lowRankGate(xs, int(F), int(D), s.Seed, l)
			for r := 0; r < int(F); r++ {
				w := float32(probit(probs[r]) * sigma / (xc * biasChannels))
				for c := 0; c < biasChannels; c++ {
					xs[r*int(D)+c] = w
				}
			}
			return xs
		}
	}
	add("token_embd.weight", s.Type, core.Shape{V, D}, embed)
	add("output_norm.weight", core.F32, core.Shape{D}, ones)
	if !ft.tied {
		add("output.weight", s.Type, core.Shape{V, D}, matrix(D))
	}
	half := int64(s.ropeDims() / 2)
	switch {
	case s.RopeFreqs:
		f := llama3Factors(s.ropeDims(), base)
		add("rope_freqs.weight", core.F32, core.Shape{half}, func(int, *rand.Rand) []float32 { return f })
	case s.Arch == "phi3":
		// llama.cpp declares them per head dim (the first rope dims / 2 count)
		n := s.headDim() / 2
		add("rope_factors_long.weight", core.F32, core.Shape{int64(n)}, longRoPEFactors(n, 1, 8))
		add("rope_factors_short.weight", core.F32, core.Shape{int64(n)}, longRoPEFactors(n, 1, 1.5))
	}
	for l := 0; l < s.Layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		add(p+"attn_norm.weight", core.F32, core.Shape{D}, norm(l))
		if ft.fused {
			add(p+"attn_qkv.weight", s.Type, core.Shape{Q + 2*KV, D}, reading(l, matrix(D)))
		} else {
			add(p+"attn_q.weight", s.Type, core.Shape{Q, D}, reading(l, matrix(D)))
			add(p+"attn_k.weight", s.Type, core.Shape{KV, D}, reading(l, matrix(D)))
			add(p+"attn_v.weight", s.Type, core.Shape{KV, D}, reading(l, matrix(D)))
		}
		if ft.bias {
			add(p+"attn_q.bias", core.F32, core.Shape{Q}, matrix(D))
			add(p+"attn_k.bias", core.F32, core.Shape{KV}, matrix(D))
			add(p+"attn_v.bias", core.F32, core.Shape{KV}, matrix(D))
		}
		if ft.qkNorm {
			add(p+"attn_q_norm.weight", core.F32, core.Shape{HD}, nearOne)
			add(p+"attn_k_norm.weight", core.F32, core.Shape{HD}, nearOne)
		}
		add(p+"attn_output.weight", s.Type, core.Shape{D, Q}, residual(Q))
		if ft.postNorms {
			add(p+"post_attention_norm.weight", core.F32, core.Shape{D}, nearOne)
		}
		add(p+"ffn_norm.weight", core.F32, core.Shape{D}, norm(l))
		if ft.fused {
			add(p+"ffn_up.weight", s.Type, core.Shape{2 * F, D}, reading(l, matrix(D)))
		} else {
			add(p+"ffn_gate.weight", s.Type, core.Shape{F, D}, reading(l, gateOf(l)))
			add(p+"ffn_up.weight", s.Type, core.Shape{F, D}, reading(l, matrix(D)))
		}
		add(p+"ffn_down.weight", s.Type, core.Shape{D, F}, residual(F))
		if ft.postNorms {
			add(p+"post_ffw_norm.weight", core.F32, core.Shape{D}, nearOne)
		}
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
