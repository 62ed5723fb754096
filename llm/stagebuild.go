package llm

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// stageBuild is the arch.Host of one stage graph: the model's weights, and its projections as
// a projection hook builds them.
type stageBuild struct {
	m *Model
	// lin, from the runner's ProjectionHook, builds the projections its technique rewrites.
	lin ProjectionBuilder
	// back are the tensors lin, a ProjectionReader, reads back: outputs of the graph after its own.
	back []*core.Tensor
}

// output makes the tensors a ProjectionReader reads back graph outputs, after the stage's own.
func (sb *stageBuild) output(g *core.Graph) {
	if rd, ok := sb.lin.(ProjectionReader); ok {
		sb.back = rd.ReadBack()
		g.Output(sb.back...)
	}
}

// Weight adds the model's tensor name to g (arch.Host).
func (sb *stageBuild) Weight(g *core.Graph, name string) *core.Tensor { return sb.m.w(g, name) }

// Linear is projection p of layer l applied to x [C, K] (arch.Host): the projection hook's (the
// W8A8 lowering), or a MATMUL with the model's weight.
func (sb *stageBuild) Linear(g *core.Graph, x *core.Tensor, l int, p string) *core.Tensor {
	if sb.lin != nil {
		if y := sb.lin.Linear(g, x, l, p); y != nil {
			return y
		}
	}
	return g.Named(p).MatMul(x, sb.m.w(g, fmt.Sprintf("blk.%d.%s.weight", l, p)))
}

// outWidth is the width of a row the last stage outputs: the vocabulary's logits, or an
// embedder's hidden state.
func (r *Runner) outWidth() int64 {
	if r.cfg.hidden {
		return int64(r.m.Config.Dim)
	}
	return int64(r.m.Config.Vocab)
}
