package llm

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// The model is cut into Layers+1 stage graphs per chunk length C (mllm-NPU's chunk-sharing
// graphs). Every shape depends only on C and the cache capacity, never on the position: RoPE
// takes positions as an input and ATTENTION its query offset, so one prepared graph serves every
// chunk of every prompt.
//
//	stage 0:    ids, pos → embedding → x and layer 0's q, k, v
//	stage l+1:  x, q, K cache, V cache, q_offset [, pos] → attention and FFN of layer l → x and
//	            layer l+1's q, k, v (or, after the last layer, the logits)
//
// K and V are stage outputs bound into the cache buffers at the chunk's row: the cache is
// appended without a copy, and since the next stage runs after this one, its attention sees the
// rows just written. A padded last chunk writes its padding rows past the last real token,
// where the causal mask hides them until real tokens overwrite them.

// Stage inputs are bound by name (see Runner.prepare); the outputs, in order, are x, q, k, v
// (k and v of the next layer, in the cache's dtype), or the logits after the last layer.
const (
	outX = iota
	outQ
	outK
	outV
)

// posInputs carries positions into a stage: the ROPE positions, or for models with
// per-frequency RoPE factors (which ROPE cannot express) cos and sin tables computed on the host
// for each chunk. Either way the graph does not depend on the position.
type posInputs struct {
	pos, cos, sin *core.Tensor
}

// addPosInputs adds the position inputs of a stage for chunk length c.
func (m *Model) addPosInputs(g *core.Graph, c int64) posInputs {
	if m.Config.RopeFreqFactors == nil {
		return posInputs{pos: g.Input("pos", core.I32, c)}
	}
	half := int64(m.Config.RopeDims / 2)
	shape := []int64{c, 1, half, 1} // broadcast over heads; pairs (x[2i], x[2i+1])
	if m.Config.RopeMode == core.RoPENeoX {
		shape = []int64{c, 1, 1, half} // pairs (x[i], x[i+half])
	}
	return posInputs{cos: g.Input("rope_cos", core.F32, shape...), sin: g.Input("rope_sin", core.F32, shape...)}
}

// buildEmbedStage builds stage 0 for chunk length c.
func (m *Model) buildEmbedStage(c int64, kv kvTypes, sb *stageBuild) (*core.Graph, error) {
	g := core.NewGraph()
	ids := g.Input("ids", core.I32, c)
	pos := m.addPosInputs(g, c)
	x := g.Named("embd").GetRows(m.w(g, "token_embd.weight"), ids)
	x = m.arch.embed(block{m, g, sb}, x)
	q, k, v := m.qkv(g, sb, x, pos, 0)
	sb.outputQKV(g, x, q, toKV(g, k, kv.K), toKV(g, v, kv.V))
	sb.output(g)
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("llm: building the embedding stage: %w", err)
	}
	return g, nil
}

// buildLayerStage builds the stage that finishes layer l for chunk length c over a cache of
// capacity rows of dtypes kv. With tree, attention takes an i8 [c, c] "mask" input: who sees whom
// among the chunk's tokens, a draft tree verified in one pass (the positions are then the
// caller's too: a tree's depth, not its row).
func (m *Model) buildLayerStage(l int, c, capacity int64, kv kvTypes, tree bool, sb *stageBuild) (*core.Graph, error) {
	cfg := m.Config
	g := core.NewGraph()
	g.SetNamePrefix(fmt.Sprintf("blk.%d.", l))
	H, Hkv, D := int64(cfg.Heads), int64(cfg.KVHeads), int64(cfg.HeadDim)
	x := g.Input("x", core.F32, c, int64(cfg.Dim))
	q := g.Input("q", core.F32, c, H, D)
	kc := g.Input("k_cache", kv.K, capacity, Hkv, D)
	vc := g.Input("v_cache", kv.V, capacity, Hkv, D)
	qoff := g.Input("q_offset", core.I32, 1)
	var mask *core.Tensor
	if tree {
		mask = g.Input("mask", core.I8, c, c)
	}
	opts := cfg.attentionOptions(l, capacity)
	opts.Causal, opts.QOffsetInput, opts.Mask = true, qoff, mask
	if tree && opts.Window > 0 {
		// ATTENTION's window and its tree mask do not combine
		return nil, fmt.Errorf("llm: layer %d: a draft tree over a sliding window of %d (context above it): %w",
			l, opts.Window, core.ErrUnsupported)
	}
	a := sb.attention(g, q, kc, vc, opts)
	// inner nodes first: Named names the next node added (plan rules match these names)
	x = m.arch.finish(block{m, g, sb}, x, g.Reshape(a, c, H*D), l)

	if l+1 < cfg.Layers {
		pos := m.addPosInputs(g, c)
		g.SetNamePrefix(fmt.Sprintf("blk.%d.", l+1))
		nq, nk, nv := m.qkv(g, sb, x, pos, l+1)
		sb.outputQKV(g, x, nq, toKV(g, nk, kv.K), toKV(g, nv, kv.V))
	} else {
		sb.head(m, g, x)
	}
	sb.output(g)
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("llm: building layer %d: %w", l, err)
	}
	return g, nil
}

// outputHead adds the logits of the last layer's output x as the graph's output.
func (m *Model) outputHead(g *core.Graph, x *core.Tensor) {
	g.Output(m.arch.logits(block{m: m, g: g}, x))
}

// norm is RMSNorm times its weight.
func (m *Model) norm(g *core.Graph, x *core.Tensor, weight string) *core.Tensor {
	return g.Mul(g.RMSNorm(x, m.Config.NormEps), m.w(g, weight))
}

// qkv computes layer l's rotated queries and keys and its values for x [C, dim].
func (m *Model) qkv(g *core.Graph, sb *stageBuild, x *core.Tensor, pos posInputs, l int) (q, k, v *core.Tensor) {
	return m.arch.qkv(block{m, g, sb}, x, pos, l)
}

// rope rotates layer l's x [C, H, D] with the ROPE op, or with the host's cos/sin tables when
// the model has per-frequency factors: the rotated dims are viewed as pairs [C, H, R/2, 2]
// (normal) or [C, H, 2, R/2] (NeoX), and each pair (u, v) becomes (u·cos − v·sin, u·sin + v·cos).
func (m *Model) rope(g *core.Graph, name string, x *core.Tensor, pos posInputs, l int) *core.Tensor {
	cfg := m.Config
	if pos.pos != nil {
		base, scale := cfg.ropeOf(l)
		return g.Named(name).RoPE(x, pos.pos, core.RoPEOptions{Mode: cfg.RopeMode,
			Dims: int64(cfg.RopeDims), Base: base, FreqScale: scale})
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
	ru := g.Sub(g.Mul(u, pos.cos), g.Mul(v, pos.sin))
	rv := g.Add(g.Mul(u, pos.sin), g.Mul(v, pos.cos))
	out := g.Reshape(g.Concat(axis, ru, rv), C, H, R)
	if rest != nil {
		out = g.Concat(2, out, rest)
	}
	return g.Named(name).Reshape(out, C, H, D)
}

// activation applies the FFN gate's activation; ReLU² is RELU then MUL, so every backend that
// runs a dense FFN runs it.
func (m *Model) activation(g *core.Graph, gate *core.Tensor) *core.Tensor {
	switch m.Config.Activation {
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
