package sched

import (
	"fmt"
	"math"
	"slices"
	"sync/atomic"

	"github.com/xpuhub/xpu/core"
)

// A stealing split (NodeSplit.Steal) shares a MATMUL's weight rows between two units at run
// time instead of by a fixed ratio. Why: in a 1B decode a split MATMUL part takes 0.1–1 ms,
// and a fixed cut leaves the whole step waiting for whichever core is slower in that token (a
// neighbour process, an interrupt, the other core's spin): traces here showed one half 1.3–2×
// slower than the other, which side changing from token to token.
//
// The rows of a task's MATMULs (the Q, K and V projections that groupParts puts in one task
// count as one row range, in node order) are cut into chunks, each a graph of its own
// prepared on both units (zero-copy weight views, as for a static split; the backend may keep
// a repacked copy per unit). Each unit's task takes chunks from its end of the range through
// one atomic word, the first unit from the front, the second from the back, until none are
// left; the consumers of the outputs wait for both tasks as they would for a static split.
// Chunks are biggest at the ends and smallest where the two sides are expected to meet (half,
// a quarter and two eighths of each side's share of the split's Ratio), so a unit usually
// runs four chunks and what the faster unit takes from the slower one's side is small. Every
// output element is computed by one chunk with the same kernel whichever unit runs it, so the
// result is the static split's.
//
// With several rows of a (a prefill chunk) a chunk's output is a column band, strided in y:
// the chunks write a scratch slot and one merge writes y (expandSteal). A prefill MATMUL of
// 256 × 4096 × 4096 f32 runs 50–110 ms, where a static cut from a profile or calibration a few
// percent off leaves one unit waiting several ms (the lab notes on tensor partitioning).

// stealFractions are the chunk sizes from each end of a task's rows, as shares of that
// side's expected part (the split's Ratio): half of it, a quarter, two eighths. Four a side
// keep a decode task's dispatches few (a few µs each against a 0.1–1 ms MATMUL).
var stealFractions = []float64{0.5, 0.25, 0.125, 0.125}

// stealFractionsRows are stealFractions for a task of several rows of a, halved twice more
// where the sides meet. A chunk takes the same time on either side (its size is in proportion
// to its side's speed), so the last one is what the faster side may wait for: an eighth of a
// 110 ms prefill MATMUL is 14 ms, a thirty-second 3.4 ms, against one more packing of a per
// call (~0.5 ms on neon). The merge then takes up to 12 pieces (two CONCAT levels).
var stealFractionsRows = []float64{0.5, 0.25, 0.125, 0.0625, 0.03125, 0.03125}

// fractionsFor are the steal fractions of a task with several rows of a (rows) or one.
func fractionsFor(rows bool) []float64 {
	if rows {
		return stealFractionsRows
	}
	return stealFractions
}

// stealSpec makes a split part a stealing task: side 0 takes chunks from the front, side 1
// from the back; nodes are the MATMULs whose rows the task shares (in order); chunks are this
// unit's prepared chunk partitions (set by prepareStage). With adapt set it is an adaptive
// task instead (NodeSplit.Adapt): chunks are this side's part at each cut point
// (adaptShares), of which a request chunk runs the one the program's cutBalancer picked.
type stealSpec struct {
	side   int
	shared bool    // its chunks are a stage's shared pieces (StageSpec.Shared), prepared as made
	share  float64 // the first side's expected share of the rows (the split's Ratio)
	adapt  bool
	nodes  []*core.Node
	// into are where each node's rows go: nil, its output in place (one row of a); else a
	// scratch slot, chunk by chunk, each chunk's [M, cols] piece contiguous (expandSteal).
	into   []*core.Tensor
	state  *stealState
	chunks []compiledPart
}

// stealState holds the claim words both sides of a task share, one per lane (request chunks
// in flight at once run in different lanes; the chunks of one lane run the task one after
// another): the epoch of the request chunk (32 bits), then how many chunks were taken from
// the front and from the back (16 bits each). A word from an older epoch counts as none taken,
// so nothing resets it between steps: a lane's next chunk starts its task only after both
// sides finished this one's. A side that finds a newer epoch takes nothing (it cannot happen
// by that order; the check keeps a late claim from clobbering the newer word).
type stealState struct {
	words []atomic.Uint64 // per lane; set when the program is compiled
	n     int             // chunks
}

// claim takes the next chunk from side's end for epoch in lane and returns its index, or -1
// when every chunk is taken.
func (s *stealState) claim(lane int, epoch uint32, side int) int {
	word := &s.words[lane]
	for {
		w := word.Load()
		var front, back int
		switch we := uint32(w >> 32); {
		case we == epoch:
			front, back = int(w>>16&0xffff), int(w&0xffff)
		case int32(we-epoch) > 0:
			return -1
		}
		if front+back >= s.n {
			return -1
		}
		idx := front
		if side == 0 {
			front++
		} else {
			idx = s.n - 1 - back
			back++
		}
		if word.CompareAndSwap(w, uint64(epoch)<<32|uint64(front)<<16|uint64(back)) {
			return idx
		}
	}
}

// canSteal says whether a split of n with m rows of a can run as a stealing or an adaptive
// one: two units cutting rows and a constant rank-2 weight, and for an adaptive one a single
// row of a (its parts then write y in place whatever the cut; with several, the merge would
// depend on the cut).
func canSteal(n *core.Node, sp *NodeSplit, m int64) bool {
	return (sp.Steal || sp.Adapt && m == 1) && sp.Strategy == SplitRows && len(sp.Units) == 2 &&
		n.Inputs[1].Kind == core.KindConst && len(n.Inputs[1].Shape) == 2
}

// expandSteal appends node n's two stealing tasks (one per unit, not prepared: their graph,
// the whole MATMUL, only describes what they read and write) and returns the indices of the
// parts that write n's output. With one row of a (m == 1) each chunk's piece is contiguous
// in y and the tasks write y in place. With several rows a piece is a column band, strided
// in y, as in a static rows split: the chunks write a scratch slot chunk after chunk (chunk
// c's [m, cols] at m × its first column), and one merge on sp.Merge (a CONCAT of the chunks
// along the columns) writes y after both tasks; the cuts are the node's own (such a task is
// never grouped with another, see groupParts).
func expandSteal(n *core.Node, sp *NodeSplit, m int64, deps []int, out *[]compiledPart) ([]int, error) {
	st := &stealState{}
	a, b, y := n.Inputs[0], n.Inputs[1], n.Output
	var into *core.Tensor // with several rows, the scratch's key: side 0's output tensor
	var writers []int
	for side, unit := range sp.Units {
		g := core.NewGraph()
		av := g.Input(a.Name, a.DType, a.Shape...)
		bv := g.Const(b.Name, b.DType, b.Shape, b.Data)
		g.Named(n.Name)
		yv := splitMatMul(g, n, av, bv)
		g.Output(yv)
		if m > 1 && into == nil {
			into = yv
		}
		outT := y
		if into != nil {
			outT = into
		}
		kind := "steal"
		if sp.Adapt {
			kind = "adapt"
		}
		label := fmt.Sprintf("[%s %s]", kind, []string{"front", "back"}[side])
		p := &Partition{Nodes: []int{n.ID}, Graph: g, Inputs: []*core.Tensor{a}, Outputs: []*core.Tensor{outT}, Deps: deps}
		i := appendPart(out, n, p, unit, []int64{0, 0}, label, true)
		(*out)[i].steal = &stealSpec{side: side, share: sp.Ratio[0], adapt: sp.Adapt, nodes: []*core.Node{n},
			into: []*core.Tensor{into}, state: st}
		writers = append(writers, i)
	}
	if into == nil {
		return writers, nil
	}
	var ins []mergeIn
	for _, segs := range stealChunks([]*core.Node{n}, sp.Ratio[0], fractionsFor(true)) {
		s := segs[0]
		ins = append(ins, mergeIn{key: into, off: m * s.r0 * y.DType.Bytes(1), rows: m, cols: s.r1 - s.r0})
	}
	w, err := appendMerge(out, n, ins, 0, sp.Merge, writers, fmt.Sprintf("merge [rows 0:%d, %d chunks]", m, len(ins)))
	if err != nil {
		return nil, err
	}
	return []int{w}, nil
}

// stealSegment is the rows [r0, r1) of nodes[node]'s weight inside one chunk.
type stealSegment struct {
	node   int
	r0, r1 int64
}

// stealChunks cuts the rows of nodes (concatenated in order) into chunks by fractions
// (fractionsFor) from both ends, the front's scaled by share and the back's by 1 - share (so
// the two sides' first chunks are in proportion to their speeds, and the ends meet at share),
// cuts rounded to rowAlign rows.
func stealChunks(nodes []*core.Node, share float64, fractions []float64) [][]stealSegment {
	starts := rowStarts(nodes)
	total := starts[len(nodes)]
	cuts := []int64{0, total}
	var cum float64
	for _, f := range fractions {
		cum += f
		for _, c := range []float64{share * cum, 1 - (1-share)*cum} {
			r := int64(math.Round(float64(total)*c/rowAlign)) * rowAlign
			cuts = append(cuts, min(max(r, 0), total))
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var chunks [][]stealSegment
	for i := 1; i < len(cuts); i++ {
		chunks = append(chunks, rowSegments(starts, cuts[i-1], cuts[i]))
	}
	return chunks
}

// rowStarts are the first rows of each node's weight in nodes' concatenated rows, and their
// total last.
func rowStarts(nodes []*core.Node) []int64 {
	starts := make([]int64, len(nodes)+1)
	for i, n := range nodes {
		starts[i+1] = starts[i] + n.Inputs[1].Shape[0]
	}
	return starts
}

// rowSegments are the rows [lo, hi) of the concatenated rows whose nodes start at starts
// (rowStarts), node by node.
func rowSegments(starts []int64, lo, hi int64) []stealSegment {
	var segs []stealSegment
	for j := range len(starts) - 1 {
		s0, s1 := max(lo, starts[j]), min(hi, starts[j+1])
		if s1 > s0 {
			segs = append(segs, stealSegment{node: j, r0: s0 - starts[j], r1: s1 - starts[j]})
		}
	}
	return segs
}

// adaptSteps are an adaptive split's cut points (NodeSplit.Adapt), as offsets from its Ratio
// of the first unit's share: ±10% in steps of 2.5%. The gap between two pinned cores here
// drifts up to 10–15% over seconds (the lab notes on tensor partitioning, "Which unit's decode parts run slower"),
// which ±10% covers; a step of 2.5% leaves at most 1.25% of the rows off balance. Each point is
// a prepared part per unit, so more points cost prepare time, not memory (the parts are rows
// of the widest one).
var adaptSteps = []float64{-0.1, -0.075, -0.05, -0.025, 0, 0.025, 0.05, 0.075, 0.1}

// adaptShares are the first unit's shares of the rows at an adaptive split's cut points
// around share, ascending.
func adaptShares(share float64) []float64 {
	out := make([]float64, len(adaptSteps))
	for i, d := range adaptSteps {
		out[i] = min(max(share+d, 0.05), 0.95)
	}
	return out
}

// adaptParts are side's rows of nodes at each cut point of adaptShares(share): the front
// [0, cut) for side 0, the back [cut, total) for side 1, cuts rounded to rowAlign rows.
func adaptParts(nodes []*core.Node, share float64, side int) [][]stealSegment {
	starts := rowStarts(nodes)
	total := starts[len(nodes)]
	var parts [][]stealSegment
	for _, s := range adaptShares(share) {
		cut := min(max(int64(math.Round(float64(total)*s/rowAlign))*rowAlign, 0), total)
		lo, hi := int64(0), cut
		if side == 1 {
			lo, hi = cut, total
		}
		parts = append(parts, rowSegments(starts, lo, hi))
	}
	return parts
}

// buildStealChunks makes the chunk partitions of a stealing task for its unit (not prepared):
// each reads its nodes' inputs whole and writes its rows of their outputs, in place or into
// the task's scratch slot (stealSpec.into). An adaptive task's "chunks" are its side's part
// at each cut point.
func buildStealChunks(c compiledPart) ([]compiledPart, error) {
	var out []compiledPart
	ranges := stealChunks(c.steal.nodes, c.steal.share, fractionsFor(c.steal.into[0] != nil))
	kind := "chunk"
	if c.steal.adapt {
		ranges, kind = adaptParts(c.steal.nodes, c.steal.share, c.steal.side), "cut"
	}
	for ci, segs := range ranges {
		g := core.NewGraph()
		p := &Partition{Graph: g, Deps: c.Deps, Device: c.unit}
		var offs []int64
		ins := map[*core.Tensor]*core.Tensor{}
		var what []string
		var outOffs []int64
		label := fmt.Sprintf("%s %d", kind, ci)
		for _, s := range segs {
			n := c.steal.nodes[s.node]
			a, b, y := n.Inputs[0], n.Inputs[1], n.Output
			k := b.Shape[1]
			av := ins[a]
			if av == nil {
				av = g.Input(a.Name, a.DType, a.Shape...)
				ins[a] = av
				p.Inputs = append(p.Inputs, a)
				offs = append(offs, 0)
			}
			bRow := b.DType.Bytes(k)
			bv := g.Const(b.Name, b.DType, core.Shape{s.r1 - s.r0, k}, b.Data[s.r0*bRow:s.r1*bRow])
			g.Named(n.Name)
			g.Output(splitMatMul(g, n, av, bv))
			// in place in y (one row of a), or a [rows, r1-r0] band at rows × r0 of the scratch
			rows := int64(1)
			if into := c.steal.into[s.node]; into != nil {
				rows = a.Shape.NumElements() / k
				p.Outputs = append(p.Outputs, into)
			} else {
				p.Outputs = append(p.Outputs, y)
			}
			outOffs = append(outOffs, rows*s.r0*y.DType.Bytes(1))
			p.Nodes = append(p.Nodes, n.ID)
			seg := fmt.Sprintf("%s [rows 0:%d, cols %d:%d]", n.Name, rows, s.r0, s.r1)
			what = append(what, "node "+seg)
			label += " " + seg
		}
		if err := g.Err(); err != nil {
			return nil, fmt.Errorf("stealing split %s: %w", c.label, err)
		}
		out = append(out, compiledPart{Partition: p, unit: c.unit, offs: append(offs, outOffs...), what: what,
			label: label})
	}
	return out, nil
}

// checkShared checks a stage's shared pieces: two distinct units, pieces of known nodes that no
// other piece and no split claims.
func checkShared(st StageSpec, splits []*NodeSplit, units int) error {
	if len(st.Shared) == 0 {
		return nil
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("stage %q: shared pieces: %s: %w", st.Name, fmt.Sprintf(format, a...), core.ErrInvalidArgument)
	}
	u := st.SharedUnits
	if u[0] == u[1] || u[0] < 0 || u[1] < 0 || u[0] >= units || u[1] >= units {
		return bad("units %v of %d", u, units)
	}
	seen := map[int]bool{}
	for _, piece := range st.Shared {
		if len(piece) == 0 {
			return bad("an empty piece")
		}
		for _, id := range piece {
			if id < 0 || id >= len(st.Graph.Nodes) || seen[id] || (splits != nil && splits[id] != nil) {
				return bad("node %d is not a node of its own", id)
			}
			seen[id] = true
		}
	}
	return nil
}

// expandShared makes the stage's shared pieces (StageSpec.Shared; pieces are the partitions
// made of them, in piece order, deps the partitions they wait for, as new indices) one stealing
// task per unit, appended to out, and returns their indices: each side describes what all the
// pieces read and write, and its chunks are the pieces prepared on its unit. The pieces'
// outputs are slots both sides' chunks write, so either unit's run of a piece serves the
// consumers, which wait for both sides.
func expandShared(st StageSpec, pieces []*Partition, deps []int, out *[]compiledPart) ([]int, error) {
	g := st.Graph
	whole := &Partition{Index: len(g.Nodes), Device: -1}
	partOf := make([]int, len(g.Nodes))
	for i := range partOf {
		partOf[i] = -1
	}
	leaves := map[*core.Tensor]bool{}
	for _, pc := range pieces {
		whole.Nodes = append(whole.Nodes, pc.Nodes...)
		for _, id := range pc.Nodes {
			partOf[id] = whole.Index
		}
		for _, t := range pc.Outputs {
			leaves[t] = true
		}
	}
	if err := whole.build(g, partOf, leaves); err != nil {
		return nil, fmt.Errorf("stage %q: shared pieces: %w", st.Name, err)
	}
	state := &stealState{n: len(pieces)}
	var sides []int
	for side, unit := range st.SharedUnits {
		p := &Partition{Nodes: whole.Nodes, Graph: whole.Graph, Inputs: whole.Inputs, Outputs: whole.Outputs, Deps: deps}
		label := fmt.Sprintf("[shared %s, %d pieces]", []string{"front", "back"}[side], len(pieces))
		n := g.Nodes[whole.Nodes[0]]
		i := appendPart(out, n, p, unit, nil, label, false)
		c := &(*out)[i]
		c.steal = &stealSpec{side: side, shared: true, state: state}
		for k, pc := range pieces {
			cp := *pc
			cp.Device = unit
			c.steal.chunks = append(c.steal.chunks, compiledPart{Partition: &cp, unit: unit,
				label: fmt.Sprintf("%s [piece %d]", partLabel(pc, g), k), what: []string{fmt.Sprintf("shared piece %d", k)}})
		}
		sides = append(sides, i)
	}
	return sides, nil
}
