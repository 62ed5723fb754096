package arch

import (
	"github.com/xpuhub/xpu/core"
)

// qwen3Arch builds Qwen3: Qwen2's layers without QKV biases, with a per-head RMSNorm of the
// queries and keys (attn_q_norm, attn_k_norm) before RoPE; heads may be wider than dim/heads
// (attention.key_length).
type qwen3Arch struct{}

func (qwen3Arch) config(_ *keys, c *Config) error {
	c.RopeMode, c.QKNorm = core.RoPENeoX, true
	return nil
}

func (qwen3Arch) Tensors(c *Config, l int) []TensorSpec {
	s := append(qkvSpecs(c, l), headNormSpecs(c, l)...)
	return append(s, layerSpecs(c, l, false)...)
}

func (qwen3Arch) Load(Loader) error { return nil }

func (qwen3Arch) Embed(_ Block, x *core.Tensor) *core.Tensor { return x }

func (qwen3Arch) QKV(b Block, x *core.Tensor, pos Pos, l int) (q, k, v *core.Tensor) {
	q, k, v = b.projectQKV(b.Norm(x, LayerName(l, "attn_norm.weight")), l)
	q = b.normAs("q_norm", q, LayerName(l, "attn_q_norm.weight"))
	k = b.normAs("k_norm", k, LayerName(l, "attn_k_norm.weight"))
	q, k = b.ropeQK(q, k, pos, l)
	return q, k, v
}

func (qwen3Arch) Finish(b Block, x, a *core.Tensor, l int) *core.Tensor {
	x = b.attnResidual(x, a, l, false)
	f := b.gatedFFN(x, l)
	return b.g.Named("ffn_residual").Add(x, f)
}

func (qwen3Arch) Logits(b Block, x *core.Tensor) *core.Tensor { return b.head(x) }

func (qwen3Arch) Plain() bool { return false }
