package llm

import (
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
)

// The model is cut into Layers+1 stage graphs per chunk length C (mllm-NPU's chunk-sharing
// graphs). Every shape depends only on C and the cache capacity, never on the position: RoPE
// takes positions as an input and ATTENTION its query offset, so one prepared graph serves every
// chunk of every prompt.
//
//	stage 0:    ids, pos → embedding → layer 0's q, k, v
//	stage l+1:  x, q, K cache, V cache, q_offset [, pos] → attention and FFN of layer l →
//	            layer l+1's q, k, v (or, after the last layer, the logits)
//
// K and V are stage outputs bound into the cache buffers at the chunk's row: the cache is
// appended without a copy, and since the next stage runs after this one, its attention sees the
// rows just written. Each stage's inputs and outputs, in binding order, are listed by the
// stageIO constants.

// Binding slots of stage 0.
const (
	s0IDs = iota
	s0Pos
	s0X // outputs from here
	s0Q
	s0K
	s0V
)

// Binding slots of a layer stage. The pos input and the q/k/v outputs exist only when a
// layer follows; the last stage outputs the logits at slot lsX.
const (
	lsX = iota
	lsQ
	lsKCache
	lsVCache
	lsQOff
	lsPos
)

// buildEmbedStage builds stage 0 for chunk length c.
func (m *Model) buildEmbedStage(c int64) (*core.Graph, error) {
	g := core.NewGraph()
	ids := g.Input("ids", core.I32, c)
	pos := g.Input("pos", core.I32, c)
	x := g.Named("embd").GetRows(m.w(g, "token_embd.weight"), ids)
	q, k, v := m.qkv(g, x, pos, 0)
	g.Output(x, q, k, v)
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("llm: building the embedding stage: %w", err)
	}
	return g, nil
}

// buildLayerStage builds the stage that finishes layer l for chunk length c over a cache of
// capacity rows.
func (m *Model) buildLayerStage(l int, c, capacity int64) (*core.Graph, error) {
	cfg := m.Config
	g := core.NewGraph()
	g.SetNamePrefix(fmt.Sprintf("blk.%d.", l))
	H, Hkv, D := int64(cfg.Heads), int64(cfg.KVHeads), int64(cfg.HeadDim)
	x := g.Input("x", core.F32, c, int64(cfg.Dim))
	q := g.Input("q", core.F32, c, H, D)
	kc := g.Input("k_cache", core.F32, capacity, Hkv, D)
	vc := g.Input("v_cache", core.F32, capacity, Hkv, D)
	qoff := g.Input("q_offset", core.I32, 1)
	p := fmt.Sprintf("blk.%d.", l)

	a := g.Named("attn").Attention(q, kc, vc, core.AttentionOptions{
		Scale: float32(1 / math.Sqrt(float64(D))), Causal: true, QOffsetInput: qoff})
	a = g.Reshape(a, c, H*D)
	x = g.Named("attn_residual").Add(x, g.Named("attn_output").MatMul(a, m.w(g, p+"attn_output.weight")))

	h := m.norm(g, x, p+"ffn_norm.weight")
	gate := g.Named("ffn_gate").MatMul(h, m.w(g, p+"ffn_gate.weight"))
	up := g.Named("ffn_up").MatMul(h, m.w(g, p+"ffn_up.weight"))
	f := g.Named("ffn_swiglu").Mul(g.SiLU(gate), up)
	x = g.Named("ffn_residual").Add(x, g.Named("ffn_down").MatMul(f, m.w(g, p+"ffn_down.weight")))

	if l+1 < cfg.Layers {
		pos := g.Input("pos", core.I32, c)
		g.SetNamePrefix(fmt.Sprintf("blk.%d.", l+1))
		nq, nk, nv := m.qkv(g, x, pos, l+1)
		g.Output(x, nq, nk, nv)
	} else {
		g.SetNamePrefix("")
		h := m.norm(g, x, "output_norm.weight")
		g.Output(g.Named("logits").MatMul(h, m.w(g, "output.weight")))
	}
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("llm: building layer %d: %w", l, err)
	}
	return g, nil
}

// norm is RMSNorm times its weight.
func (m *Model) norm(g *core.Graph, x *core.Tensor, weight string) *core.Tensor {
	return g.Mul(g.RMSNorm(x, m.Config.NormEps), m.w(g, weight))
}

// qkv computes layer l's rotated queries and keys and its values for x [C, dim].
func (m *Model) qkv(g *core.Graph, x, pos *core.Tensor, l int) (q, k, v *core.Tensor) {
	cfg := m.Config
	p := fmt.Sprintf("blk.%d.", l)
	C := x.Shape[0]
	h := m.norm(g, x, p+"attn_norm.weight")
	proj := func(name string, heads int) *core.Tensor {
		t := g.Named(name).MatMul(h, m.w(g, p+name+".weight"))
		if cfg.QKVBias {
			t = g.Add(t, m.w(g, p+name+".bias"))
		}
		return g.Reshape(t, C, int64(heads), int64(cfg.HeadDim))
	}
	rope := core.RoPEOptions{Mode: cfg.RopeMode, Dims: int64(cfg.RopeDims), Base: cfg.RopeBase,
		FreqScale: cfg.RopeFreqScale}
	q = g.Named("q_rope").RoPE(proj("attn_q", cfg.Heads), pos, rope)
	k = g.Named("k_rope").RoPE(proj("attn_k", cfg.KVHeads), pos, rope)
	v = proj("attn_v", cfg.KVHeads)
	return q, k, v
}
