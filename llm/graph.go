package llm

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/arch"
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

// posInputs carries positions into a stage (arch.Pos).
type posInputs = arch.Pos

// addPosInputs adds the position inputs of a stage for chunk length c.
func (m *Model) addPosInputs(g *core.Graph, c int64) posInputs {
	return arch.PosInputs(g, &m.Config, c)
}

// buildEmbedStage builds stage 0 for chunk length c.
func (m *Model) buildEmbedStage(c int64, kv kvTypes, sb *stageBuild) (*core.Graph, error) {
	g := core.NewGraph()
	ids := g.Input("ids", core.I32, c)
	pos := m.addPosInputs(g, c)
	x := g.Named("embd").GetRows(m.w(g, "token_embd.weight"), ids)
	x = m.arch.Embed(m.block(g, sb), x)
	q, k, v := m.qkv(g, sb, x, pos, 0)
	g.Output(x, q, toKV(g, k, kv.K), toKV(g, v, kv.V))
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
	H, D := int64(cfg.Heads), int64(cfg.HeadDim)
	in := m.LayerInputs(g, c, capacity, kv)
	x := in.X
	var mask *core.Tensor
	if tree {
		mask = g.Input("mask", core.I8, c, c)
	}
	opts := cfg.AttentionOptions(l, capacity)
	opts.Causal, opts.QOffsetInput, opts.Mask = true, in.QOffset, mask
	if tree && opts.Window > 0 {
		// ATTENTION's window and its tree mask do not combine
		return nil, fmt.Errorf("llm: layer %d: a draft tree over a sliding window of %d (context above it): %w",
			l, opts.Window, core.ErrUnsupported)
	}
	a := g.Named("attn").Attention(in.Q, in.KCache, in.VCache, opts)
	// inner nodes first: Named names the next node added (plan rules match these names)
	x = m.arch.Finish(m.block(g, sb), x, g.Reshape(a, c, H*D), l)

	if l+1 < cfg.Layers {
		pos := m.addPosInputs(g, c)
		g.SetNamePrefix(fmt.Sprintf("blk.%d.", l+1))
		nq, nk, nv := m.qkv(g, sb, x, pos, l+1)
		g.Output(x, nq, toKV(g, nk, kv.K), toKV(g, nv, kv.V))
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
	g.Output(m.arch.Logits(m.block(g, nil), x))
}

// norm is RMSNorm times its weight.
func (m *Model) norm(g *core.Graph, x *core.Tensor, weight string) *core.Tensor {
	return arch.Norm(g, &m.Config, x, m.w(g, weight))
}

// qkv computes layer l's rotated queries and keys and its values for x [C, dim].
func (m *Model) qkv(g *core.Graph, sb *stageBuild, x *core.Tensor, pos posInputs, l int) (q, k, v *core.Tensor) {
	return m.arch.QKV(m.block(g, sb), x, pos, l)
}

// rope rotates layer l's x [C, H, D] (arch.Rope).
func (m *Model) rope(g *core.Graph, name string, x *core.Tensor, pos posInputs, l int) *core.Tensor {
	return arch.Rope(g, &m.Config, name, x, pos, l)
}

// activation applies the FFN gate's activation (arch.Activate).
func (m *Model) activation(g *core.Graph, gate *core.Tensor) *core.Tensor {
	return arch.Activate(g, m.Config.Activation, gate)
}

// block is the shared blocks' view of m adding to g: its weights, and its linear layers as
// the stage build sb lowers them (nil: plain matrix products).
func (m *Model) block(g *core.Graph, sb *stageBuild) arch.Block {
	return arch.NewBlock(g, &m.Config, archHost{m, sb})
}

// archHost gives the architecture builders the model's weights and linear layers.
type archHost struct {
	m  *Model
	sb *stageBuild
}

func (h archHost) Weight(g *core.Graph, name string) *core.Tensor { return h.m.w(g, name) }

func (h archHost) Linear(g *core.Graph, x *core.Tensor, l int, name string) *core.Tensor {
	return h.m.linear(g, h.sb, x, l, name)
}
