package llm

import (
	"github.com/xpuhub/xpu/core"
)

// llamaArch builds Llama (1, 2, 3.x with rope_freqs.weight; Mistral's GGUFs are "llama" too)
// and Qwen2 (QKV biases, NeoX RoPE): pre-norm attention and SwiGLU FFN.
type llamaArch struct {
	rope int64
	bias bool
	// window: <arch>.attention.sliding_window, when present, makes every layer slide
	// (Mistral 7B v0.1).
	window bool
	// noRopeStep: every n-th layer has no RoPE (SmolLM3: 4, fixed by the architecture as in
	// llama.cpp).
	noRopeStep int
}

func (a llamaArch) config(k *keys, c *Config) error {
	c.RopeMode, c.QKVBias, c.NoRopeStep = a.rope, a.bias, a.noRopeStep
	if a.window {
		return k.num("attention.sliding_window", 0, &c.SlidingWindow)
	}
	return nil
}

func (a llamaArch) tensors(c *Config, l int) []tensorSpec {
	return append(qkvSpecs(c, l), layerSpecs(c, l, false)...)
}

// load reads Llama 3.1's per-frequency RoPE factors.
func (a llamaArch) load(m *Model) error {
	f, err := m.ropeFactors("rope_freqs.weight")
	m.Config.RopeFreqFactors = f
	return err
}

func (llamaArch) embed(_ block, x *core.Tensor) *core.Tensor { return x }

func (llamaArch) qkv(b block, x *core.Tensor, pos posInputs, l int) (q, k, v *core.Tensor) {
	q, k, v = b.projectQKV(b.norm(x, layerName(l, "attn_norm.weight")), l)
	q, k = b.ropeQK(q, k, pos, l)
	return q, k, v
}

func (llamaArch) finish(b block, x, a *core.Tensor, l int) *core.Tensor {
	x = b.attnResidual(x, a, l, false)
	f := b.gatedFFN(x, l)
	return b.g.Named("ffn_residual").Add(x, f)
}

func (llamaArch) logits(b block, x *core.Tensor) *core.Tensor { return b.head(x) }

// plain: the decode shards and the Go forward pass rotate every layer.
func (a llamaArch) plain() bool { return a.noRopeStep == 0 }
