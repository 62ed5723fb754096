package arch

import (
	"math"

	"github.com/xpuhub/xpu/core"
)

// gemmaArch builds Gemma 2 and Gemma 3: embeddings scaled by √dim, GELU-gated FFN, RMSNorms
// after attention and after the FFN as well as before (post_attention_norm, post_ffw_norm),
// NeoX RoPE and interleaved sliding-window layers. Gemma 2 soft-caps the attention scores
// and the logits; Gemma 3 instead norms each head's queries and keys, slides five layers of
// six and rotates its sliding layers with base 10000 and no scaling. (GGUF conversion stores
// Gemma's norm weights as 1 + w, so they multiply as any other.)
type gemmaArch struct{ version int }

func (a gemmaArch) config(k *keys, c *Config) error {
	c.RopeMode, c.Activation = core.RoPENeoX, ActGELU
	c.EmbedScale = float32(math.Sqrt(float64(c.Dim)))
	// The query scale is 1/√head_dim but 1/√(dim/heads) for the 27B models, which llama.cpp
	// tells by their layer count.
	c.AttnScale = float32(1 / math.Sqrt(float64(c.HeadDim)))
	if (a.version == 2 && c.Layers == 46) || (a.version == 3 && c.Layers == 62) {
		c.AttnScale = float32(1 / math.Sqrt(float64(c.Dim/c.Heads)))
	}
	if a.version == 3 {
		c.QKNorm, c.SWAPattern = true, 6
		c.LocalRopeBase, c.LocalRopeFreqScale = 10000, 1
		return k.num("attention.sliding_window", -1, &c.SlidingWindow)
	}
	c.SWAPattern = 2
	if err := k.num("attention.sliding_window", 4096, &c.SlidingWindow); err != nil {
		return err
	}
	if err := k.flt("attn_logit_softcapping", 50, &c.AttnSoftCap, positive, "above 0"); err != nil {
		return err
	}
	return k.flt("final_logit_softcapping", 30, &c.FinalSoftCap, positive, "above 0")
}

func (a gemmaArch) Tensors(c *Config, l int) []TensorSpec {
	s := qkvSpecs(c, l)
	if a.version == 3 {
		s = append(s, headNormSpecs(c, l)...)
	}
	D := core.Shape{int64(c.Dim)}
	return append(append(s, layerSpecs(c, l, false)...),
		TensorSpec{Name: LayerName(l, "post_attention_norm.weight"), Shape: D, Vector: true},
		TensorSpec{Name: LayerName(l, "post_ffw_norm.weight"), Shape: D, Vector: true})
}

func (gemmaArch) Load(Loader) error { return nil }

func (gemmaArch) Embed(b Block, x *core.Tensor) *core.Tensor {
	return b.g.Named("embd_scaled").Scale(x, b.c.EmbedScale, 0)
}

func (a gemmaArch) QKV(b Block, x *core.Tensor, pos Pos, l int) (q, k, v *core.Tensor) {
	q, k, v = b.projectQKV(b.Norm(x, LayerName(l, "attn_norm.weight")), l)
	if a.version == 3 {
		q = b.normAs("q_norm", q, LayerName(l, "attn_q_norm.weight"))
		k = b.normAs("k_norm", k, LayerName(l, "attn_k_norm.weight"))
	}
	q, k = b.ropeQK(q, k, pos, l)
	return q, k, v
}

func (gemmaArch) Finish(b Block, x, a *core.Tensor, l int) *core.Tensor {
	x = b.attnResidual(x, a, l, true)
	f := b.gatedFFN(x, l)
	f = b.normAs("ffn_post_norm", f, LayerName(l, "post_ffw_norm.weight"))
	return b.g.Named("ffn_residual").Add(x, f)
}

func (a gemmaArch) Logits(b Block, x *core.Tensor) *core.Tensor {
	y := b.head(x)
	if c := b.c.FinalSoftCap; c > 0 {
		y = b.softCap("logits_softcap", y, c)
	}
	return y
}

func (gemmaArch) Plain() bool { return false }
