package llm

import (
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
)

// Config is a Llama-family model's shape, read from GGUF metadata (llama.cpp's keys).
type Config struct {
	Arch          string // "llama" or "qwen2"
	ContextLength int    // trained context (<arch>.context_length)
	Dim           int    // embedding_length
	Layers        int    // block_count
	FFN           int    // feed_forward_length
	Heads         int    // attention.head_count
	KVHeads       int    // attention.head_count_kv
	HeadDim       int    // Dim / Heads
	RopeDims      int    // rope.dimension_count (≤ HeadDim)
	RopeBase      float32
	RopeFreqScale float32
	RopeMode      int64 // core.RoPENormal (llama) or core.RoPENeoX (qwen2)
	NormEps       float32
	Vocab         int
	QKVBias       bool // qwen2
	// RopeFreqFactors divide each rotary frequency (rope_freqs.weight, Llama 3.1 and later);
	// nil when the model has none.
	RopeFreqFactors []float32
	// Activation is the FFN gate's activation, from <arch>.feed_forward_activation
	// (ActivationKey); SiLU when the key is absent.
	Activation Activation
}

// Activation is an FFN gate activation.
type Activation string

// The FFN activations the runtime builds. ReLU-family gates make most neurons exactly 0 per
// token, which is what a sparse FFN skips.
const (
	ActSiLU  Activation = "silu"  // SwiGLU: silu(gate) · up (Llama, Qwen2)
	ActReLU  Activation = "relu"  // relu(gate) · up (ReluLLaMA, ProSparse)
	ActReLU2 Activation = "relu2" // relu(gate)² · up (squared ReLU, TurboSparse/Bamboo style)
)

// ActivationKey is the GGUF metadata key, after "<arch>.", that names the FFN activation as a
// string ("silu", "relu", "relu2"). llama.cpp's mainline has no generic key for it (its ReLU
// models are separate architectures), so this one is ours, named after
// <arch>.feed_forward_length; llama.cpp ignores it, so a ReLU model's SiLU twin differs only here.
const ActivationKey = "feed_forward_activation"

// ParseActivation reads an activation name; an unknown one is an error naming the choices.
func ParseActivation(s string) (Activation, error) {
	switch a := Activation(s); a {
	case ActSiLU, ActReLU, ActReLU2:
		return a, nil
	}
	return "", fmt.Errorf("llm: FFN activation %q (supported: silu, relu, relu2): %w", s, core.ErrInvalidArgument)
}

// Sparse reports whether the activation is 0 for every negative gate (the ReLU family).
func (a Activation) Sparse() bool { return a == ActReLU || a == ActReLU2 }

// archs lists what the builder knows and the RoPE order each uses.
var archs = map[string]struct {
	rope    int64
	qkvBias bool
}{
	"llama": {core.RoPENormal, false},
	"qwen2": {core.RoPENeoX, true},
}

// ConfigFromGGUF reads the hyperparameters; a missing key or an unknown architecture is an
// error naming it.
func ConfigFromGGUF(f *gguf.File) (Config, error) {
	var c Config
	av, _ := f.Get("general.architecture")
	c.Arch, _ = av.Str()
	a, ok := archs[c.Arch]
	if !ok {
		return c, fmt.Errorf("llm: architecture %q (supported: llama, qwen2): %w", c.Arch, core.ErrUnsupported)
	}
	c.RopeMode, c.QKVBias = a.rope, a.qkvBias
	num := func(key string, def int, dst *int) error {
		v, ok := f.Get(c.Arch + "." + key)
		if !ok {
			if def < 0 {
				return fmt.Errorf("llm: missing %s.%s: %w", c.Arch, key, core.ErrInvalidArgument)
			}
			*dst = def
			return nil
		}
		n, ok := v.Int()
		if !ok || n < 0 || n > 1<<31 {
			return fmt.Errorf("llm: %s.%s = %v is not a valid count: %w", c.Arch, key, v.Any(), core.ErrInvalidArgument)
		}
		*dst = int(n)
		return nil
	}
	// A NaN or infinite epsilon or RoPE base makes every logit NaN: refuse it here, naming the
	// key, rather than generate empty text.
	flt := func(key string, def float32, dst *float32, ok func(float64) bool, want string) error {
		*dst = def
		v, present := f.Get(c.Arch + "." + key)
		if !present {
			return nil
		}
		x, isNum := v.Float()
		if !isNum || math.IsNaN(x) || math.IsInf(x, 0) || !ok(x) || math.IsInf(float64(float32(x)), 0) {
			return fmt.Errorf("llm: %s.%s = %v: must be a finite number %s: %w", c.Arch, key, v.Any(), want, core.ErrInvalidArgument)
		}
		*dst = float32(x)
		return nil
	}
	positive := func(x float64) bool { return x > 0 }
	for _, k := range []struct {
		key string
		def int
		dst *int
	}{
		{"context_length", 2048, &c.ContextLength},
		{"embedding_length", -1, &c.Dim},
		{"block_count", -1, &c.Layers},
		{"feed_forward_length", -1, &c.FFN},
		{"attention.head_count", -1, &c.Heads},
		{"attention.head_count_kv", 0, &c.KVHeads},
		{"rope.dimension_count", 0, &c.RopeDims},
	} {
		if err := num(k.key, k.def, k.dst); err != nil {
			return c, err
		}
	}
	c.Activation = ActSiLU
	if v, ok := f.Get(c.Arch + "." + ActivationKey); ok {
		str, isStr := v.Str()
		if !isStr {
			return c, fmt.Errorf("llm: %s.%s must be a string, got %s: %w", c.Arch, ActivationKey, v.Type, core.ErrInvalidArgument)
		}
		a, err := ParseActivation(str)
		if err != nil {
			return c, fmt.Errorf("llm: %s.%s: %w", c.Arch, ActivationKey, err)
		}
		c.Activation = a
	}
	if err := flt("rope.freq_base", 10000, &c.RopeBase, positive, "above 0"); err != nil {
		return c, err
	}
	if err := flt("attention.layer_norm_rms_epsilon", 1e-5, &c.NormEps,
		func(x float64) bool { return x >= 0 }, "of 0 or more"); err != nil {
		return c, err
	}
	// llama.cpp reads a scaling factor of 0 as none.
	var factor float32
	if err := flt("rope.scaling.factor", 0, &factor, func(x float64) bool {
		return x == 0 || (x > 0 && !math.IsInf(float64(1/float32(x)), 0))
	}, "of 0 (none) or above"); err != nil {
		return c, err
	}
	c.RopeFreqScale = 1
	if factor > 0 {
		c.RopeFreqScale = 1 / factor
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.Heads == 0 || c.Dim%c.Heads != 0 || c.KVHeads == 0 || c.Heads%c.KVHeads != 0 || c.Layers == 0 {
		return c, fmt.Errorf("llm: inconsistent shape: dim %d, %d heads, %d kv heads, %d layers: %w",
			c.Dim, c.Heads, c.KVHeads, c.Layers, core.ErrInvalidArgument)
	}
	c.HeadDim = c.Dim / c.Heads
	if c.RopeDims == 0 {
		c.RopeDims = c.HeadDim
	}
	if c.RopeDims > c.HeadDim || c.RopeDims%2 != 0 {
		return c, fmt.Errorf("llm: rope dims %d must be even and at most the head dim %d: %w",
			c.RopeDims, c.HeadDim, core.ErrInvalidArgument)
	}
	return c, nil
}

// ropeTables returns cos and sin of every position × rotary frequency, [len(pos), R/2] row-major,
// for models with per-frequency factors: θ_i = pos · freq_scale · base^(−2i/R) / factor_i.
func (c Config) ropeTables(pos []int32) (cos, sin []float32) {
	half := c.RopeDims / 2
	cos, sin = make([]float32, len(pos)*half), make([]float32, len(pos)*half)
	for i := 0; i < half; i++ {
		freq := float64(c.RopeFreqScale) * math.Pow(float64(c.RopeBase), -2*float64(i)/float64(c.RopeDims)) /
			float64(c.RopeFreqFactors[i])
		for t, p := range pos {
			s, co := math.Sincos(float64(p) * freq)
			cos[t*half+i], sin[t*half+i] = float32(co), float32(s)
		}
	}
	return cos, sin
}
