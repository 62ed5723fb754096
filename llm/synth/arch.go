package synth

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
)

// Architectures lists the names Preset takes: the GGUF architectures xpu builds, plus "llama3"
// (Llama 3.1-style rope_freqs.weight) and "mistral" (a sliding window), both written as
// general.architecture "llama", as their real GGUFs are.
func Architectures() []string {
	names := make([]string, 0, len(variants))
	for n := range variants {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// variant is what a Preset architecture name sets on top of the size.
type variant struct {
	arch string
	// set adjusts the sized spec.
	set func(s *Spec)
}

// Windows of the synthetic sliding-window models: a quarter of the context, so a long
// generation crosses them.
func quarterWindow(s *Spec) { s.Window = s.Context / 4 }

var variants = map[string]variant{
	"llama": {arch: "llama"},
	"qwen2": {arch: "qwen2"},
	"llama3": {arch: "llama", set: func(s *Spec) {
		s.RopeFreqs, s.RopeBase = true, 500000
	}},
	"mistral": {arch: "llama", set: quarterWindow},
	// Qwen3's heads are twice dim/heads wide (Qwen3-0.6B: 1024 wide, 16 heads of 128).
	"qwen3": {arch: "qwen3", set: func(s *Spec) { s.HeadDim = 2 * s.Dim / s.Heads }},
	// Phi-4-mini rotates three quarters of each head.
	"phi3": {arch: "phi3", set: func(s *Spec) {
		quarterWindow(s)
		s.RopeDims = s.Dim / s.Heads * 3 / 4 &^ 1
	}},
	// ik_llama.cpp's Gemma 2 graph picks the query scale by model size, and knows only 26, 42
	// and 46 layers.
	"gemma2": {arch: "gemma2", set: func(s *Spec) {
		quarterWindow(s)
		if s.Layers != 42 && s.Layers != 46 {
			s.Layers = 26
		}
	}},
	"smollm3": {arch: "smollm3"},
	"granite": {arch: "granite"},
	"gemma3": {arch: "gemma3", set: func(s *Spec) {
		quarterWindow(s)
		s.RopeBase = 1000000
	}},
}

// features of a GGUF architecture's layers, as llama.cpp lays out their tensors.
type features struct {
	bias      bool // attn_q/k/v.bias (qwen2)
	qkNorm    bool // attn_q_norm, attn_k_norm (qwen3, gemma3)
	fused     bool // attn_qkv and ffn_up = gate ‖ up (phi3)
	postNorms bool // post_attention_norm, post_ffw_norm (gemma)
	tied      bool // no output.weight: the head is the embedding (gemma)
	neox      bool
}

func featuresOf(arch string) features {
	switch arch {
	case "qwen2":
		return features{bias: true, neox: true}
	case "qwen3":
		return features{qkNorm: true, neox: true}
	case "phi3":
		return features{fused: true, neox: true}
	case "gemma2":
		return features{postNorms: true, tied: true, neox: true}
	case "gemma3":
		return features{qkNorm: true, postNorms: true, tied: true, neox: true}
	case "granite":
		return features{tied: true}
	}
	return features{}
}

// archKeys are the metadata llama.cpp reads for s's architecture beyond the common keys.
func archKeys(s Spec) []gguf.KeyValue {
	a := s.Arch
	kv := func(key string, v any) gguf.KeyValue {
		return gguf.KeyValue{Key: a + "." + key, Value: gguf.MustValue(v)}
	}
	var out []gguf.KeyValue
	if s.HeadDim != 0 && s.HeadDim != s.Dim/s.Heads || a == "qwen3" || a == "gemma2" || a == "gemma3" {
		out = append(out, kv("attention.key_length", uint32(s.headDim())), kv("attention.value_length", uint32(s.headDim())))
	}
	if s.Window > 0 {
		out = append(out, kv("attention.sliding_window", uint32(s.Window)))
	}
	switch a {
	case "phi3":
		// LongRoPE as Phi-4-mini's conversion writes it: the original context, and the
		// attention factor √(1 + ln(scale)/ln(original)) of the extension.
		orig := s.phi3OrigContext()
		scale := float64(s.Context) / float64(orig)
		out = append(out, kv("rope.scaling.original_context_length", uint32(orig)),
			kv("rope.scaling.attn_factor", float32(math.Sqrt(1+math.Log(scale)/math.Log(float64(orig))))))
	case "gemma2":
		out = append(out, kv("attn_logit_softcapping", float32(50)), kv("final_logit_softcapping", float32(30)))
	case "granite":
		// Granite 3's multipliers, the query scale 1/head_dim
		out = append(out, kv("embedding_scale", float32(12)), kv("residual_scale", float32(0.22)),
			kv("logit_scale", float32(8)), kv("attention.scale", float32(1/float64(s.headDim()))))
	}
	return out
}

// phi3OrigContext is the synthetic phi3's pre-extension context: half the context, so a
// runner at the full context takes the long factors.
func (s Spec) phi3OrigContext() int { return max(s.Context/2, 1) }

// llama3Factors are Llama 3.1's rope_freqs.weight for rotary dims r and base: scale 8, low and
// high frequency factors 1 and 4, original context 8192 (what its conversion computes).
func llama3Factors(r int, base float64) []float32 {
	const factor, low, high, orig = 8.0, 1.0, 4.0, 8192.0
	out := make([]float32, r/2)
	for i := range out {
		freq := math.Pow(base, -2*float64(i)/float64(r))
		wavelen := 2 * math.Pi / freq
		switch {
		case wavelen < orig/high:
			out[i] = 1
		case wavelen > orig/low:
			out[i] = factor
		default:
			smooth := (orig/wavelen - low) / (high - low)
			out[i] = float32(1 / ((1-smooth)/factor + smooth))
		}
	}
	return out
}

// longRoPEFactors are seeded LongRoPE-like factors, n of them rising from about lo to hi.
func longRoPEFactors(n int, lo, hi float64) func(int, *rand.Rand) []float32 {
	return func(_ int, rng *rand.Rand) []float32 {
		out := make([]float32, n)
		for i := range out {
			t := float64(i) / float64(max(n-1, 1))
			out[i] = float32(lo + (hi-lo)*t*t + 0.05*rng.Float64())
		}
		return out
	}
}

// nearOne is a norm weight of 1 ± 0.2, so a test sees which weight multiplies where.
func nearOne(n int, rng *rand.Rand) []float32 {
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = 1 + 0.4*(rng.Float32()-0.5)
	}
	return xs
}

// checkArch validates what the architecture adds.
func (s Spec) checkArch() error {
	if _, ok := variants[s.Arch]; !ok || s.Arch == "llama3" || s.Arch == "mistral" {
		return fmt.Errorf("synth: architecture %q (%v; llama3 and mistral are presets of llama): %w", s.Arch,
			[]string{"gemma2", "gemma3", "granite", "llama", "phi3", "qwen2", "qwen3", "smollm3"}, core.ErrUnsupported)
	}
	plain := s.Arch == "llama" || s.Arch == "qwen2"
	hd := s.headDim()
	switch {
	case !plain && (s.Sparsity > 0 || s.Outliers > 0 || (s.Activation != "" && s.Activation != "silu")):
		return fmt.Errorf("synth: sparsity, outliers and activations are for llama and qwen2, not %s: %w", s.Arch, core.ErrUnsupported)
	case hd <= 0 || s.RopeDims < 0 || s.RopeDims > hd || s.RopeDims%2 != 0 || s.Window < 0:
		return fmt.Errorf("synth: head dim %d, rope dims %d, window %d: %w", hd, s.RopeDims, s.Window, core.ErrInvalidArgument)
	case s.RopeFreqs && s.Arch != "llama":
		return fmt.Errorf("synth: rope_freqs.weight is Llama 3's, not %s's: %w", s.Arch, core.ErrInvalidArgument)
	}
	return nil
}

// headDim is the attention head width.
func (s Spec) headDim() int {
	if s.HeadDim > 0 {
		return s.HeadDim
	}
	if s.Heads == 0 {
		return 0
	}
	return s.Dim / s.Heads
}

// ropeDims is the rotated width of each head.
func (s Spec) ropeDims() int {
	if s.RopeDims > 0 {
		return s.RopeDims
	}
	return s.headDim()
}
