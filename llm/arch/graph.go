package arch

import "github.com/xpuhub/xpu/core"

// Pos carries positions into a stage: the ROPE positions, or for models with
// per-frequency RoPE factors (which ROPE cannot express) cos and sin tables computed on the host
// for each chunk. Either way the graph does not depend on the position.
type Pos struct {
	Pos, Cos, Sin *core.Tensor
}

// PosInputs adds the position inputs of a stage for chunk length c.
func PosInputs(g *core.Graph, cfg *Config, c int64) Pos {
	if cfg.RopeFreqFactors == nil {
		return Pos{Pos: g.Input("pos", core.I32, c)}
	}
	half := int64(cfg.RopeDims / 2)
	shape := []int64{c, 1, half, 1} // broadcast over heads; pairs (x[2i], x[2i+1])
	if cfg.RopeMode == core.RoPENeoX {
		shape = []int64{c, 1, 1, half} // pairs (x[i], x[i+half])
	}
	return Pos{Cos: g.Input("rope_cos", core.F32, shape...), Sin: g.Input("rope_sin", core.F32, shape...)}
}

// Norm is RMSNorm of x over its last axis (the config's epsilon) times the weight w.
func Norm(g *core.Graph, cfg *Config, x, w *core.Tensor) *core.Tensor {
	return g.Mul(g.RMSNorm(x, cfg.NormEps), w)
}

// Rope rotates layer l's x [C, H, D] with the ROPE op, or with the host's cos/sin tables when
// the model has per-frequency factors: the rotated dims are viewed as pairs [C, H, R/2, 2]
// (normal) or [C, H, 2, R/2] (NeoX), and each pair (u, v) becomes (u·cos − v·sin, u·sin + v·cos).
func Rope(g *core.Graph, cfg *Config, name string, x *core.Tensor, pos Pos, l int) *core.Tensor {
	if pos.Pos != nil {
		base, scale := cfg.RopeOf(l)
		return g.Named(name).RoPE(x, pos.Pos, core.RoPEOptions{Mode: cfg.RopeMode,
			Dims: int64(cfg.RopeDims), Base: base, FreqScale: scale})
	}
	if x == nil {
		return nil // the graph has recorded its error
	}
	C, H, D, R := x.Shape[0], x.Shape[1], x.Shape[2], int64(cfg.RopeDims)
	rot, rest := x, (*core.Tensor)(nil)
	if R < D {
		rot, rest = g.Slice(x, 2, 0, R), g.Slice(x, 2, R, D-R)
	}
	axis, pairs := 3, []int64{C, H, R / 2, 2}
	if cfg.RopeMode == core.RoPENeoX {
		axis, pairs = 2, []int64{C, H, 2, R / 2}
	}
	p := g.Reshape(rot, pairs...)
	u, v := g.Slice(p, axis, 0, 1), g.Slice(p, axis, 1, 1)
	ru := g.Sub(g.Mul(u, pos.Cos), g.Mul(v, pos.Sin))
	rv := g.Add(g.Mul(u, pos.Sin), g.Mul(v, pos.Cos))
	out := g.Reshape(g.Concat(axis, ru, rv), C, H, R)
	if rest != nil {
		out = g.Concat(2, out, rest)
	}
	return g.Named(name).Reshape(out, C, H, D)
}

// Activate applies the FFN gate's activation; ReLU² is RELU then MUL, so every backend that
// runs a dense FFN runs it.
func Activate(g *core.Graph, a Activation, gate *core.Tensor) *core.Tensor {
	switch a {
	case ActGELU:
		return g.Named("ffn_gelu").GELU(gate)
	case ActReLU:
		return g.Named("ffn_relu").ReLU(gate)
	case ActReLU2:
		r := g.Named("ffn_relu").ReLU(gate)
		return g.Named("ffn_relu2").Mul(r, r)
	}
	return g.Named("ffn_silu").SiLU(gate)
}
