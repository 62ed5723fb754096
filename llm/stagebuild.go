package llm

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// stageBuild is the arch.Host of one stage graph: the model's weights, and its projections as
// a projection hook lowers them and the projection taps (WithTap) record them.
type stageBuild struct {
	m *Model
	// lin, from the runner's ProjectionHook, builds the projections its technique rewrites.
	lin ProjectionBuilder
	// taps, when not nil, collects the MATMUL inputs and outputs as extra graph outputs.
	taps *tapSet
}

// tapSet lists a stage's tapped tensors and what each is.
type tapSet struct {
	tensors []*core.Tensor
	what    []Tap
	seen    map[*core.Tensor]bool
}

// Tap says what a tapped tensor holds: the input of projection Proj ("attn_q", "ffn_down",
// ...) of layer Layer, or with Out set its output. Projections that share an input tap it once,
// under the first of them the graph applies.
type Tap struct {
	Layer int
	Proj  string
	Out   bool
}

// output makes the taps graph outputs, after the stage's own (no taps: nothing).
func (sb *stageBuild) output(g *core.Graph) {
	if sb.taps != nil {
		g.Output(sb.taps.tensors...)
	}
}

func (t *tapSet) add(x *core.Tensor, w Tap) {
	if t == nil || x == nil || t.seen[x] {
		return
	}
	if t.seen == nil {
		t.seen = map[*core.Tensor]bool{}
	}
	t.seen[x] = true
	t.tensors = append(t.tensors, x)
	t.what = append(t.what, w)
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
	y := g.Named(p).MatMul(x, sb.m.w(g, fmt.Sprintf("blk.%d.%s.weight", l, p)))
	sb.taps.add(x, Tap{Layer: l, Proj: p})
	sb.taps.add(y, Tap{Layer: l, Proj: p, Out: true})
	return y
}

// outWidth is the width of a row the last stage outputs: the vocabulary's logits, or an
// embedder's hidden state.
func (r *Runner) outWidth() int64 {
	if r.cfg.hidden {
		return int64(r.m.Config.Dim)
	}
	return int64(r.m.Config.Vocab)
}
