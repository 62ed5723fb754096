package arch

import (
	"github.com/xpuhub/xpu/core"
)

// phi3Arch builds Phi-3 and Phi-4-mini: Llama's layers with Q, K and V fused into attn_qkv
// and the FFN's gate and up into ffn_up (gate rows first), NeoX RoPE over the first
// rope.dimension_count dims of each head, LongRoPE factors (rope_factors_short/long.weight,
// chosen by the context length) and a sliding window over every layer.
type phi3Arch struct{ llamaArch }

func (phi3Arch) config(k *keys, c *Config) error {
	c.RopeMode = core.RoPENeoX
	// llama.cpp's defaults for files converted before the key existed
	switch {
	case (c.Layers == 32 || c.Layers == 40) && c.ContextLength == 4096:
		c.SlidingWindow = 2047 // Phi-3-mini-4k, Phi-3-medium-4k
	case c.Layers == 32 && c.KVHeads == 32 && c.ContextLength == 131072:
		c.SlidingWindow = 262144 // Phi-3-mini-128k
	case c.Layers == 40 && c.ContextLength == 131072:
		c.SlidingWindow = 131072 // Phi-3-medium-128k
	}
	if err := k.num("attention.sliding_window", c.SlidingWindow, &c.SlidingWindow); err != nil {
		return err
	}
	if err := k.num("rope.scaling.original_context_length", c.ContextLength, &c.RopeOrigContext); err != nil {
		return err
	}
	return k.flt("rope.scaling.attn_factor", 0, &c.RopeAttnFactor, positive, "above 0")
}

func (phi3Arch) Tensors(c *Config, l int) []TensorSpec {
	D, q, kv := int64(c.Dim), int64(c.Heads*c.HeadDim), int64(c.KVHeads*c.HeadDim)
	return append([]TensorSpec{{Name: LayerName(l, "attn_qkv.weight"), Shape: core.Shape{q + 2*kv, D}}},
		layerSpecs(c, l, true)...)
}

// load splits the fused matrices into Llama's (row ranges of the file's bytes: no copy) and
// reads the LongRoPE factors.
func (phi3Arch) Load(ld Loader) error {
	c := ld.Config
	q, kv, F := int64(c.Heads*c.HeadDim), int64(c.KVHeads*c.HeadDim), int64(c.FFN)
	for l := range c.Layers {
		if err := ld.SplitRows(LayerName(l, "attn_qkv.weight"), []string{"attn_q", "attn_k", "attn_v"}, l, q, kv, kv); err != nil {
			return err
		}
		if err := ld.SplitRows(LayerName(l, "ffn_up.weight"), []string{"ffn_gate", "ffn_up"}, l, F, F); err != nil {
			return err
		}
	}
	short, err := ropeFactors(ld, "rope_factors_short.weight")
	if err != nil {
		return err
	}
	long, err := ropeFactors(ld, "rope_factors_long.weight")
	if err != nil {
		return err
	}
	ones := func() []float32 {
		f := make([]float32, c.RopeDims/2)
		for i := range f {
			f[i] = 1
		}
		return f
	}
	// llama.cpp applies no factors where one of the pair is missing; the attention factor
	// scales cos and sin, which only the host tables do.
	if short == nil && (long != nil || (c.RopeAttnFactor != 0 && c.RopeAttnFactor != 1)) {
		short = ones()
	}
	if long == nil && short != nil {
		long = ones()
	}
	ld.Config.RopeFreqFactors, ld.Config.RopeFactorsLong = short, long
	return nil
}

func (phi3Arch) Plain() bool { return false }
