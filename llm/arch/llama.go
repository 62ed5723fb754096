package arch

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

func (a llamaArch) Tensors(c *Config, l int) []TensorSpec {
	return append(qkvSpecs(c, l), layerSpecs(c, l, false)...)
}

// load reads Llama 3.1's per-frequency RoPE factors.
func (a llamaArch) Load(ld Loader) error {
	f, err := ropeFactors(ld, "rope_freqs.weight")
	ld.Config.RopeFreqFactors = f
	return err
}

func (llamaArch) Embed(_ Block, x *core.Tensor) *core.Tensor { return x }

func (llamaArch) QKV(b Block, x *core.Tensor, pos Pos, l int) (q, k, v *core.Tensor) {
	q, k, v = b.projectQKV(b.Norm(x, LayerName(l, "attn_norm.weight")), l)
	q, k = b.ropeQK(q, k, pos, l)
	return q, k, v
}

func (llamaArch) Finish(b Block, x, a *core.Tensor, l int) *core.Tensor {
	x = b.attnResidual(x, a, l, false)
	f := b.gatedFFN(x, l)
	return b.g.Named("ffn_residual").Add(x, f)
}

func (llamaArch) Logits(b Block, x *core.Tensor) *core.Tensor { return b.head(x) }

// plain: the decode shards and the Go forward pass rotate every layer.
func (a llamaArch) Plain() bool { return a.noRopeStep == 0 }
