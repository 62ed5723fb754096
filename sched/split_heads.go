package sched

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// A heads split of an ATTENTION (q [Tq, Hq, D], k and v [Tk, Hkv, ·] → [Tq, Hq, Dv]) cuts the
// KV heads by the ratio; each part is an ATTENTION on its unit over its KV head range (op set
// 4), reading the KV cache whole but only its heads' slice of each row, and the query heads of
// those KV heads. With one query row (decode) a part's query heads are a contiguous slice of q
// and its output a contiguous slice of the node's: read and written in place, no merge. This
// halves the decode step's attention, the one large op of the chain a row split of the
// MATMULs leaves on a single unit while the others wait for it.

// expandHeadSplit appends ATTENTION node n's parts to out, each depending on deps, and returns
// their indices (all of them write n's output). With several query rows the slices would be
// strided, so the node then runs whole on the split's Merge unit (the rule's unit).
func expandHeadSplit(n *core.Node, sp *NodeSplit, deps []int, out *[]compiledPart) ([]int, error) {
	q, k, y := n.Inputs[0], n.Inputs[1], n.Output
	tq, hq, d := q.Shape[0], q.Shape[1], q.Shape[2]
	hkv, dv := k.Shape[1], y.Shape[2]
	if hkv == 0 || hq%hkv != 0 {
		return nil, fmt.Errorf("split of %s: %d query heads over %d KV heads: %w", n, hq, hkv, core.ErrInvalidArgument)
	}
	group := hq / hkv
	type piece struct{ unit, h0, nh int64 }
	var pieces []piece
	if tq == 1 {
		var h0 int64
		for u, c := range cutPoints(hkv, sp.Ratio, 1) {
			if c > 0 {
				pieces = append(pieces, piece{int64(sp.Units[u]), h0, c})
			}
			h0 += c
		}
	}
	if len(pieces) < 2 {
		pieces = []piece{{int64(sp.Merge), 0, hkv}} // whole, on one unit
	}
	qElem, yElem := q.DType.Bytes(1), y.DType.Bytes(1)
	var writers []int
	for _, pc := range pieces {
		g := core.NewGraph()
		whole := pc.nh == hkv
		p := &Partition{Nodes: []int{n.ID}, Graph: g, Deps: deps}
		var offs []int64
		args := make([]*core.Tensor, len(n.Inputs))
		for i, t := range n.Inputs {
			shape, off := t.Shape, int64(0)
			if i == 0 && !whole {
				shape, off = core.Shape{tq, pc.nh * group, d}, pc.h0*group*d*qElem
			}
			if t.Kind == core.KindConst { // its view, by slicing the data
				args[i] = g.Const(t.Name, t.DType, shape, t.Data[off:off+t.DType.Bytes(shape.NumElements())])
				continue
			}
			args[i] = g.Input(t.Name, t.DType, shape...)
			p.Inputs = append(p.Inputs, t)
			offs = append(offs, off)
		}
		o := core.AttentionOptions{Scale: n.FAttr[0], Causal: n.IAttr[0] == 1, QOffset: n.IAttr[1]}
		if len(args) > 3 {
			o.QOffsetInput = args[3]
		}
		if len(args) > 4 {
			o.Mask = args[4]
		}
		label := "[whole]"
		if !whole {
			o.KVHeadOffset, o.KVHeads = pc.h0, pc.nh
			label = fmt.Sprintf("[kv heads %d:%d]", pc.h0, pc.h0+pc.nh)
		}
		g.Output(g.Named(n.Name).Attention(args[0], args[1], args[2], o))
		if err := g.Err(); err != nil {
			return nil, fmt.Errorf("split of %s: %w", n, err)
		}
		p.Outputs = []*core.Tensor{y}
		offs = append(offs, pc.h0*group*dv*yElem)
		writers = append(writers, appendPart(out, n, p, int(pc.unit), offs, label, !whole))
	}
	return writers, nil
}
