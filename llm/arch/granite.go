package arch

import (
	"github.com/xpuhub/xpu/core"
)

// graniteArch builds IBM Granite 3: Llama's layers with four multipliers (μP), all required
// as llama.cpp requires them: embedding_scale on the embeddings, attention.scale as the query
// scale, residual_scale on each branch before its residual add, and the logits divided by
// logit_scale.
type graniteArch struct{ llamaArch }

func (a graniteArch) config(k *keys, c *Config) error {
	if err := a.llamaArch.config(k, c); err != nil {
		return err
	}
	for _, f := range []struct {
		key string
		dst *float32
	}{
		{"embedding_scale", &c.EmbedScale}, {"attention.scale", &c.AttnScale},
		{"residual_scale", &c.ResidualScale}, {"logit_scale", &c.LogitScale},
	} {
		if !k.has(f.key) {
			return missingKey(k, f.key)
		}
		if err := k.flt(f.key, 0, f.dst, positive, "above 0"); err != nil {
			return err
		}
	}
	return nil
}

func (graniteArch) Embed(b Block, x *core.Tensor) *core.Tensor {
	return b.g.Named("embd_scaled").Scale(x, b.c.EmbedScale, 0)
}

func (graniteArch) Finish(b Block, x, a *core.Tensor, l int) *core.Tensor {
	rs := b.c.ResidualScale
	o := b.g.Scale(b.Linear(a, l, "attn_output"), rs, 0)
	x = b.g.Named("attn_residual").Add(x, o)
	f := b.g.Scale(b.gatedFFN(x, l), rs, 0)
	return b.g.Named("ffn_residual").Add(x, f)
}

func (graniteArch) Logits(b Block, x *core.Tensor) *core.Tensor {
	y := b.head(x)
	return b.g.Named("logits_scaled").Scale(y, 1/b.c.LogitScale, 0)
}

func (graniteArch) Plain() bool { return false }
