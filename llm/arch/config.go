package arch

import (
	"fmt"
	"math"
	"strings"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
)

// Config is a decoder-only transformer's shape, read from GGUF metadata (llama.cpp's keys).
// The common keys are read for every architecture; each architecture's builder (arch.go)
// reads its own and sets the fields below that describe how its layers differ, much as
// llama.cpp's hparams serve every llm_build_* function.
type Config struct {
	Arch          string // general.architecture: one of Architectures()
	ContextLength int    // trained context (<arch>.context_length)
	Dim           int    // embedding_length
	Layers        int    // block_count
	FFN           int    // feed_forward_length
	Heads         int    // attention.head_count
	KVHeads       int    // attention.head_count_kv
	HeadDim       int    // attention.key_length, else Dim / Heads
	RopeDims      int    // rope.dimension_count (≤ HeadDim)
	RopeBase      float32
	RopeFreqScale float32
	RopeMode      int64 // core.RoPENormal (llama) or core.RoPENeoX (qwen2, qwen3, phi3, gemma)
	NormEps       float32
	Vocab         int
	QKVBias       bool // qwen2
	// RopeFreqFactors divide each rotary frequency (rope_freqs.weight, Llama 3.1 and later; phi3's
	// rope_factors_short.weight); nil when the model has none. With them the runner computes
	// RoPE's cos and sin on the host (RopeTables).
	RopeFreqFactors []float32
	// Activation is the FFN gate's activation, from <arch>.feed_forward_activation
	// (ActivationKey); SiLU when the key is absent (GELU for Gemma).
	Activation Activation

	// QKNorm: queries and keys get a per-head RMSNorm (attn_q_norm, attn_k_norm) before RoPE
	// (qwen3, gemma3).
	QKNorm bool
	// EmbedScale multiplies the token embeddings (Gemma: √dim); 0 means none.
	EmbedScale float32
	// AttnScale is the attention's query scale; 0 means 1/√HeadDim.
	AttnScale float32
	// AttnSoftCap c > 0 turns every attention score s into c·tanh(s/c) before the softmax
	// (<arch>.attn_logit_softcapping, Gemma 2).
	AttnSoftCap float32
	// FinalSoftCap c > 0 does the same to the logits (<arch>.final_logit_softcapping).
	FinalSoftCap float32
	// SlidingWindow w > 0: a sliding-window layer's query sees the w most recent keys, itself
	// included (<arch>.attention.sliding_window).
	SlidingWindow int
	// SWAPattern says which layers slide, as llama.cpp's n_swa_pattern: with n > 1, layer l
	// does when l % n < n-1 (Gemma 2: n = 2, Gemma 3: n = 6); 0 means every layer (phi3,
	// Mistral).
	SWAPattern int
	// LocalRopeBase and LocalRopeFreqScale, when not 0, are the RoPE base and scale of the
	// sliding-window layers (Gemma 3: 10000 and 1, while global layers use RopeBase).
	LocalRopeBase, LocalRopeFreqScale float32
	// RopeFactorsLong replace RopeFreqFactors when the runner's context exceeds
	// RopeOrigContext (LongRoPE: phi3's rope_factors_long.weight, as llama.cpp chooses).
	RopeFactorsLong []float32
	RopeOrigContext int // rope.scaling.original_context_length
	// RopeAttnFactor multiplies RoPE's cos and sin (rope.scaling.attn_factor, LongRoPE); 0 means 1.
	RopeAttnFactor float32
	// NoRopeStep n > 0: every n-th layer (l+1 a multiple of n) has no RoPE (SmolLM3's NoPE
	// layers).
	NoRopeStep int
	// ResidualScale multiplies each attention and FFN output before its residual add, and
	// the logits are divided by LogitScale (Granite's granite.residual_scale, .logit_scale);
	// 0 means none.
	ResidualScale, LogitScale float32
}

// Rotates reports whether layer l applies RoPE to its queries and keys.
func (c Config) Rotates(l int) bool { return c.NoRopeStep <= 0 || (l+1)%c.NoRopeStep != 0 }

// Sliding reports whether layer l uses sliding-window attention.
func (c Config) Sliding(l int) bool {
	if c.SlidingWindow <= 0 {
		return false
	}
	if c.SWAPattern <= 1 {
		return true
	}
	return l%c.SWAPattern < c.SWAPattern-1
}

// RopeOf is layer l's RoPE base and frequency scale: a sliding layer's own where the model has them.
func (c Config) RopeOf(l int) (base, scale float32) {
	base, scale = c.RopeBase, c.RopeFreqScale
	if c.Sliding(l) {
		if c.LocalRopeBase > 0 {
			base = c.LocalRopeBase
		}
		if c.LocalRopeFreqScale > 0 {
			scale = c.LocalRopeFreqScale
		}
	}
	return base, scale
}

// Activation is an FFN gate activation.
type Activation string

// The FFN activations the runtime builds. ReLU-family gates make most neurons exactly 0 per
// token, which is what a sparse FFN skips.
const (
	ActSiLU  Activation = "silu"  // SwiGLU: silu(gate) · up (Llama, Qwen2)
	ActReLU  Activation = "relu"  // relu(gate) · up (ReluLLaMA, ProSparse)
	ActReLU2 Activation = "relu2" // relu(gate)² · up (squared ReLU, TurboSparse/Bamboo style)
	// ActGELU is GELU (tanh form) · up, GeGLU: the Gemma builders set it, no key selects it.
	ActGELU Activation = "gelu"
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
	return "", fmt.Errorf("arch: FFN activation %q (supported: silu, relu, relu2): %w", s, core.ErrInvalidArgument)
}

// Sparse reports whether the activation is 0 for every negative gate (the ReLU family).
func (a Activation) Sparse() bool { return a == ActReLU || a == ActReLU2 }

// ConfigFromGGUF reads the hyperparameters; a missing key or an unknown architecture is an
// error naming it.
func ConfigFromGGUF(f *gguf.File) (Config, error) {
	var c Config
	av, _ := f.Get("general.architecture")
	c.Arch, _ = av.Str()
	a, ok := archs[c.Arch]
	if !ok {
		return c, fmt.Errorf("arch: architecture %q (supported: %s): %w", c.Arch, strings.Join(Architectures(), ", "), core.ErrUnsupported)
	}
	k := keys{f: f, arch: c.Arch}
	num, flt := k.num, k.flt
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
			return c, fmt.Errorf("arch: %s.%s must be a string, got %s: %w", c.Arch, ActivationKey, v.Type, core.ErrInvalidArgument)
		}
		a, err := ParseActivation(str)
		if err != nil {
			return c, fmt.Errorf("arch: %s.%s: %w", c.Arch, ActivationKey, err)
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
	// Qwen3 and Gemma heads are wider or narrower than dim / heads: the key length says.
	var keyLen, valueLen int
	if err := num("attention.key_length", 0, &keyLen); err != nil {
		return c, err
	}
	if err := num("attention.value_length", keyLen, &valueLen); err != nil {
		return c, err
	}
	if valueLen != keyLen {
		return c, fmt.Errorf("arch: %s.attention.value_length %d differs from the key length %d: %w",
			c.Arch, valueLen, keyLen, core.ErrUnsupported)
	}
	if c.Heads == 0 || (keyLen == 0 && c.Dim%c.Heads != 0) || c.KVHeads == 0 || c.Heads%c.KVHeads != 0 || c.Layers == 0 {
		return c, fmt.Errorf("arch: inconsistent shape: dim %d, %d heads, %d kv heads, %d layers: %w",
			c.Dim, c.Heads, c.KVHeads, c.Layers, core.ErrInvalidArgument)
	}
	c.HeadDim = c.Dim / c.Heads
	if keyLen > 0 {
		c.HeadDim = keyLen
	}
	if c.RopeDims == 0 {
		c.RopeDims = c.HeadDim
	}
	if c.RopeDims > c.HeadDim || c.RopeDims%2 != 0 {
		return c, fmt.Errorf("arch: rope dims %d must be even and at most the head dim %d: %w",
			c.RopeDims, c.HeadDim, core.ErrInvalidArgument)
	}
	if err := a.config(&k, &c); err != nil {
		return c, err
	}
	return c, nil
}

// keys reads an architecture's numeric metadata, "<arch>.<key>", with errors that name the key.
type keys struct {
	f    *gguf.File
	arch string
}

// num reads a count into dst; def < 0 makes the key required, otherwise def is its default.
func (k *keys) num(key string, def int, dst *int) error {
	v, ok := k.f.Get(k.arch + "." + key)
	if !ok {
		if def < 0 {
			return fmt.Errorf("arch: missing %s.%s: %w", k.arch, key, core.ErrInvalidArgument)
		}
		*dst = def
		return nil
	}
	n, ok := v.Int()
	if !ok || n < 0 || n > 1<<31 {
		return fmt.Errorf("arch: %s.%s = %v is not a valid count: %w", k.arch, key, v.Any(), core.ErrInvalidArgument)
	}
	*dst = int(n)
	return nil
}

// flt reads a float into dst (def when absent). A NaN or infinite value makes every logit NaN:
// it is refused here, naming the key, rather than generating empty text; ok says which finite
// values are valid, want describes them.
func (k *keys) flt(key string, def float32, dst *float32, ok func(float64) bool, want string) error {
	*dst = def
	v, present := k.f.Get(k.arch + "." + key)
	if !present {
		return nil
	}
	x, isNum := v.Float()
	if !isNum || math.IsNaN(x) || math.IsInf(x, 0) || !ok(x) || math.IsInf(float64(float32(x)), 0) {
		return fmt.Errorf("arch: %s.%s = %v: must be a finite number %s: %w", k.arch, key, v.Any(), want, core.ErrInvalidArgument)
	}
	*dst = float32(x)
	return nil
}

// has reports whether the key is present.
func (k *keys) has(key string) bool {
	_, ok := k.f.Get(k.arch + "." + key)
	return ok
}

// missingKey is the error for a required key that is absent.
func missingKey(k *keys, key string) error {
	return fmt.Errorf("arch: missing %s.%s: %w", k.arch, key, core.ErrInvalidArgument)
}

func positive(x float64) bool { return x > 0 }

// RopeTables returns cos and sin of every position × rotary frequency, [len(pos), R/2] row-major,
// for models with per-frequency factors: θ_i = pos · freq_scale · base^(−2i/R) / factor_i, cos
// and sin times the attention factor. A runner of context ctxLen beyond RopeOrigContext takes
// the long factors when the model has them, as llama.cpp does.
func (c Config) RopeTables(pos []int32, ctxLen int) (cos, sin []float32) {
	mscale := 1.0
	if c.RopeAttnFactor > 0 {
		mscale = float64(c.RopeAttnFactor)
	}
	return c.RotationTables(pos, ctxLen, mscale)
}

// RotationTables are RopeTables with the given magnitude: 1 for a pure rotation, such as the
// context shift's turn of K rows that already carry the attention factor.
func (c Config) RotationTables(pos []int32, ctxLen int, mscale float64) (cos, sin []float32) {
	half := c.RopeDims / 2
	factors := c.RopeFreqFactors
	if c.RopeFactorsLong != nil && ctxLen > c.RopeOrigContext {
		factors = c.RopeFactorsLong
	}
	cos, sin = make([]float32, len(pos)*half), make([]float32, len(pos)*half)
	for i := 0; i < half; i++ {
		freq := float64(c.RopeFreqScale) * math.Pow(float64(c.RopeBase), -2*float64(i)/float64(c.RopeDims)) /
			float64(factors[i])
		for t, p := range pos {
			s, co := math.Sincos(float64(p) * freq)
			cos[t*half+i], sin[t*half+i] = float32(co*mscale), float32(s*mscale)
		}
	}
	return cos, sin
}
