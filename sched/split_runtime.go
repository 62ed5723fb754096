package sched

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/xpuhub/xpu/core"
)

// A split MATMUL y = a·bᵀ ([M, K] × [N, K] → [M, N]) becomes parts, one per SplitPart, each a
// MATMUL graph of its own on its unit: it reads a view of a's rows (a byte offset into a's
// arena storage, no copy) and a view of b's rows (a constant weight is sliced by byte offset,
// zero-copy: quantized rows are whole blocks, so any row cut works). A part whose output rows
// are contiguous in y (all N columns, or a single row as in decode) writes straight into its
// slice of y. Column pieces of several rows are strided in y, and the ABI has no strided
// tensors: such pieces get activation slots of their own and an explicit merge part (a CONCAT
// along the columns, on the split's Merge unit) writes each row band into y. Parts are tasks
// like any partition: they depend on a's producer, y's consumers depend on every part and
// merge that writes y, and parts on different units run at the same time.

// checkSplits validates a stage's splits against its graph and units; nil when it has none.
func (rt *Runtime) checkSplits(st StageSpec) ([]*NodeSplit, error) {
	if st.Splits == nil {
		return nil, nil
	}
	g := st.Graph
	if len(st.Splits) != len(g.Nodes) {
		return nil, fmt.Errorf("stage %q: %d splits for %d nodes: %w", st.Name, len(st.Splits), len(g.Nodes),
			core.ErrInvalidArgument)
	}
	has := false
	for id, sp := range st.Splits {
		if sp == nil {
			continue
		}
		has = true
		n := g.Nodes[id]
		bad := func(format string, args ...any) error {
			return fmt.Errorf("stage %q: split of %s: %s: %w", st.Name, n, fmt.Sprintf(format, args...), core.ErrInvalidArgument)
		}
		if err := validateSplit(sp.Strategy, len(sp.Units), sp.Ratio, sp.Lengths); err != nil {
			return nil, bad("%v", err)
		}
		for i, u := range append(slices.Clone(sp.Units), sp.Merge) {
			if u < 0 || u >= len(rt.units) {
				return nil, bad("unit index %d of %d units", u, len(rt.units))
			}
			if i < len(sp.Units) && slices.Contains(sp.Units[:i], u) {
				return nil, bad("unit %s listed twice", rt.units[u].Name())
			}
		}
		if !sp.Strategy.splits(n.Op) {
			if n.Op == core.OpAttention {
				return nil, bad("an ATTENTION splits by heads only, not %s", sp.Strategy)
			}
			return nil, bad("%s splits MATMUL nodes only", sp.Strategy)
		}
		if n.Op == core.OpAttention {
			if n.IAttr[3] != 0 {
				return nil, bad("it already runs on a KV head range")
			}
			continue
		}
		a, b := n.Inputs[0], n.Inputs[1]
		if len(b.Shape) != 2 {
			return nil, bad("b %s is not a rank-2 weight", b)
		}
		if a == b {
			return nil, bad("a and b are one tensor")
		}
		if a.Shape[len(a.Shape)-1] != b.Shape[1] {
			return nil, bad("a %s and b %s", a, b)
		}
	}
	if !has {
		return nil, nil
	}
	return st.Splits, nil
}

// prepareStage prepares a stage's partitions, expanding each split node's partition (on a
// pseudo unit) into its parts and merges, grouping sibling parts into shared tasks
// (groupParts), and renumbers the partitions and their Deps. Split parts and merges are
// analyzed here (the stage's other partitions were before).
func (rt *Runtime) prepareStage(ctx context.Context, st StageSpec, splits []*NodeSplit, parts []*Partition,
	prepOpts map[int]map[string]string) (out []compiledPart, err error) {
	defer func() {
		if err != nil {
			for _, c := range out {
				if c.exe != nil {
					c.exe.Close()
				}
				if c.steal != nil {
					for _, ch := range c.steal.chunks {
						if ch.exe != nil {
							ch.exe.Close()
						}
					}
				}
			}
			out = nil
		}
	}()
	writers := make([][]int, len(parts)) // old partition index -> the new ones writing its outputs
	// shared pieces' partitions (StageSpec.Shared), by pseudo device
	var pieces []*Partition
	piece := map[int]bool{}
	for _, pc := range st.Shared {
		piece[len(rt.units)+pc[0]] = true
	}
	for _, part := range parts {
		if piece[part.Device] {
			pieces = append(pieces, part)
		}
	}
	for _, part := range parts {
		var deps []int
		for _, d := range part.Deps {
			deps = append(deps, writers[d]...)
		}
		slices.Sort(deps)
		deps = slices.Compact(deps)
		if piece[part.Device] {
			if writers[part.Index] != nil {
				continue // made with the first piece
			}
			var all []int
			for _, pc := range pieces {
				for _, d := range pc.Deps {
					if d >= part.Index {
						return out, fmt.Errorf("stage %q: a shared piece waits for partition %d, after the first piece: %w",
							st.Name, d, core.ErrInvalidArgument)
					}
					all = append(all, writers[d]...)
				}
			}
			slices.Sort(all)
			sides, err := expandShared(st, pieces, slices.Compact(all), &out)
			if err != nil {
				return out, err
			}
			for _, pc := range pieces {
				writers[pc.Index] = sides
			}
			continue
		}
		if part.Device < len(rt.units) {
			np := *part
			np.Index, np.Deps = len(out), deps
			writers[part.Index] = []int{np.Index}
			out = append(out, compiledPart{Partition: &np, unit: part.Device})
			continue
		}
		id := part.Nodes[0]
		if writers[part.Index], err = expandSplit(st.Graph.Nodes[id], splits[id], deps, &out); err != nil {
			return out, fmt.Errorf("stage %q: %w", st.Name, err)
		}
	}
	if out, err = groupParts(out); err != nil {
		return out, fmt.Errorf("stage %q: %w", st.Name, err)
	}
	for i := range out {
		c := &out[i]
		if c.steal != nil && c.steal.shared {
			if err := rt.prepareShared(ctx, c, prepOpts); err != nil {
				return out, fmt.Errorf("stage %q: %w", st.Name, err)
			}
			continue
		}
		if c.steal != nil {
			if err := rt.prepareSteal(ctx, c, prepOpts); err != nil {
				return out, fmt.Errorf("stage %q: %w", st.Name, err)
			}
			continue
		}
		if c.what != nil {
			if err := rt.analyzePart(ctx, c.Graph, c.unit, c.what); err != nil {
				return out, fmt.Errorf("stage %q: %w", st.Name, err)
			}
		}
		if c.exe, err = rt.preparePart(ctx, c.Graph, c.unit, prepOpts); err != nil {
			label := c.label
			if label == "" {
				label = partLabel(c.Partition, st.Graph)
			}
			return out, fmt.Errorf("unit %s: prepare partition %d (%s): %w", rt.units[c.unit].Name(), c.Index, label, err)
		}
	}
	return out, nil
}

// groupParts makes split parts on one unit with the same dependencies one task: the Q, K and
// V projections of a layer split the same way run as one graph per unit instead of three, so
// a step pays a third of their dispatches (the handoffs between units stay: one each way per
// group). Parts with the same
// dependencies are independent of each other, and the group takes the place of its first
// member, which every user of any member comes after.
func groupParts(items []compiledPart) ([]compiledPart, error) {
	newIdx := make([]int, len(items))
	var members [][]int
	open := map[string]int{} // unit and deps -> group
	for i, c := range items {
		if c.splitPart {
			k := fmt.Sprint(c.unit, c.Deps, c.steal != nil, c.steal != nil && c.steal.adapt)
			if c.steal != nil && c.steal.into[0] != nil {
				// a stealing task of several rows has a merge cut by its own chunks
				k = fmt.Sprint(k, c.steal.nodes[0].ID)
			}
			if j, ok := open[k]; ok {
				members[j] = append(members[j], i)
				newIdx[i] = j
				continue
			}
			open[k] = len(members)
		}
		newIdx[i] = len(members)
		members = append(members, []int{i})
	}
	out := make([]compiledPart, len(members))
	for j, ms := range members {
		c := items[ms[0]]
		if len(ms) > 1 {
			var err error
			if c, err = combineParts(items, ms); err != nil {
				return nil, err
			}
			if items[ms[0]].steal != nil {
				// the group shares its rows as one range, through its first member's word
				// (the same node heads the group on the other side)
				first := items[ms[0]].steal
				st := &stealSpec{side: first.side, share: first.share, adapt: first.adapt, state: first.state}
				for _, m := range ms {
					st.nodes = append(st.nodes, items[m].steal.nodes...)
					st.into = append(st.into, items[m].steal.into...)
				}
				c.steal = st
			}
		} else {
			np := *c.Partition
			c.Partition = &np
		}
		var deps []int
		for _, d := range c.Deps {
			deps = append(deps, newIdx[d])
		}
		slices.Sort(deps)
		c.Index, c.Deps = j, slices.Compact(deps)
		out[j] = c
	}
	return out, nil
}

// combineParts builds one partition running the parts ms of items: their inputs shared where
// they read the same view, their outputs side by side.
func combineParts(items []compiledPart, ms []int) (compiledPart, error) {
	first := items[ms[0]]
	g := core.NewGraph()
	p := &Partition{Graph: g, Deps: first.Deps}
	var offs, outOffs []int64
	var outs []*core.Tensor
	var what, labels []string
	type view struct {
		key   *core.Tensor
		off   int64
		shape string
	}
	shared := map[view]*core.Tensor{}
	for _, m := range ms {
		c := items[m]
		local := map[*core.Tensor]*core.Tensor{}
		for k, t := range c.Graph.Inputs {
			v := view{c.Inputs[k], c.offs[k], t.Shape.String()}
			lt := shared[v]
			if lt == nil {
				lt = g.Input(t.Name, t.DType, t.Shape...)
				shared[v] = lt
				p.Inputs = append(p.Inputs, c.Inputs[k])
				offs = append(offs, c.offs[k])
			}
			local[t] = lt
		}
		for _, n := range c.Graph.Nodes {
			args := make([]*core.Tensor, len(n.Inputs))
			for i, t := range n.Inputs {
				if t.Kind == core.KindConst {
					args[i] = g.Const(t.Name, t.DType, t.Shape, t.Data)
				} else {
					args[i] = local[t]
				}
			}
			local[n.Output] = g.CopyNode(n, args...)
		}
		for k, t := range c.Graph.Outputs {
			g.Output(local[t])
			outs = append(outs, c.Outputs[k])
			outOffs = append(outOffs, c.offs[len(c.Graph.Inputs)+k])
		}
		p.Nodes = append(p.Nodes, c.Nodes...)
		what = append(what, c.what...)
		labels = append(labels, c.label)
	}
	if err := g.Err(); err != nil {
		return compiledPart{}, fmt.Errorf("grouping split parts %s: %w", strings.Join(labels, ", "), err)
	}
	p.Outputs = outs
	return compiledPart{Partition: p, unit: first.unit, offs: append(offs, outOffs...), what: what,
		label: strings.Join(labels, " + "), splitPart: true}, nil
}

// preparePart prepares one partition graph on a unit with the program's prepare options, or
// takes the runtime's cached executable of the same graph there (exeCache). Closing what it
// returns gives the program's reference back.
func (rt *Runtime) preparePart(ctx context.Context, g *core.Graph, unit int, prepOpts map[int]map[string]string) (core.Executable, error) {
	key := exeCacheKey(unit, rt.units[unit].Name(), prepOpts[unit], g)
	return rt.exes.get(ctx, key, g, func(ctx context.Context) (core.Executable, error) {
		var opts []core.PrepareOption
		for k, v := range prepOpts[unit] {
			opts = append(opts, core.WithPrepareOption(k, v))
		}
		return rt.units[unit].Context().Prepare(ctx, g, opts...)
	})
}

// analyzePart fails with ErrPlanRefused when unit refuses a node of g; what names each node
// in the error.
func (rt *Runtime) analyzePart(ctx context.Context, g *core.Graph, unit int, what []string) error {
	u := rt.units[unit]
	vs, err := u.Context().Analyze(ctx, g)
	if err != nil {
		return fmt.Errorf("unit %s: analyze %s: %w", u.Name(), strings.Join(what, ", "), err)
	}
	var refusals []error
	for i, v := range vs {
		if !v.Supported && i < len(g.Nodes) && i < len(what) {
			refusals = append(refusals, fmt.Errorf("%s (%s) on unit %s: %s", what[i], g.Nodes[i].Op, u.Name(), v.Reason))
		}
	}
	if len(refusals) > 0 {
		return fmt.Errorf("%w: %w", ErrPlanRefused, errors.Join(refusals...))
	}
	return nil
}

// expandSplit appends node n's parts and merges to out (each depending on deps, the node's
// producers; not prepared yet) and returns the indices of those that write n's output.
func expandSplit(n *core.Node, sp *NodeSplit, deps []int, out *[]compiledPart) ([]int, error) {
	if n.Op == core.OpAttention {
		return expandHeadSplit(n, sp, deps, out)
	}
	a, b, y := n.Inputs[0], n.Inputs[1], n.Output
	k, nCols := b.Shape[1], b.Shape[0]
	m := int64(1)
	if k > 0 {
		m = a.Shape.NumElements() / k
	}
	pieces, err := SplitParts(sp.Strategy, m, nCols, sp.Ratio, sp.Lengths)
	if err != nil {
		return nil, fmt.Errorf("split of %s: %w", n, err)
	}
	if len(pieces) == 0 {
		return nil, fmt.Errorf("split of %s: an empty [%d, %d] output: %w", n, m, nCols, core.ErrInvalidArgument)
	}
	if canSteal(n, sp, m) {
		return expandSteal(n, sp, m, deps, out)
	}
	aRow, bRow, yElem := a.DType.Bytes(k), b.DType.Bytes(k), y.DType.Bytes(1)
	var writers []int
	type band struct {
		row, rows int64
		parts     []int
		ins       []mergeIn
	}
	var bands []*band
	for _, pc := range pieces {
		unit := sp.Units[pc.Unit]
		g := core.NewGraph()
		av := g.Input(a.Name, a.DType, pc.Rows, k)
		p := &Partition{Nodes: []int{n.ID}, Graph: g, Inputs: []*core.Tensor{a}, Deps: deps}
		offs := []int64{pc.Row * aRow}
		var bv *core.Tensor
		if b.Kind == core.KindConst {
			bv = g.Const(b.Name, b.DType, core.Shape{pc.Cols, k}, b.Data[pc.Col*bRow:(pc.Col+pc.Cols)*bRow])
		} else {
			bv = g.Input(b.Name, b.DType, pc.Cols, k)
			p.Inputs = append(p.Inputs, b)
			offs = append(offs, pc.Col*bRow)
		}
		g.Named(n.Name)
		yv := splitMatMul(g, n, av, bv)
		g.Output(yv)
		if err := g.Err(); err != nil {
			return nil, fmt.Errorf("split of %s: %w", n, err)
		}
		label := fmt.Sprintf("[rows %d:%d, cols %d:%d]", pc.Row, pc.Row+pc.Rows, pc.Col, pc.Col+pc.Cols)
		if pc.Cols == nCols || pc.Rows == 1 {
			// contiguous in y: written in place
			p.Outputs = []*core.Tensor{y}
			offs = append(offs, (pc.Row*nCols+pc.Col)*yElem)
			writers = append(writers, appendPart(out, n, p, unit, offs, label, true))
			continue
		}
		p.Outputs = []*core.Tensor{yv} // a slot of its own, merged below
		offs = append(offs, 0)
		appendPart(out, n, p, unit, offs, label, true)
		i := slices.IndexFunc(bands, func(bd *band) bool { return bd.row == pc.Row && bd.rows == pc.Rows })
		if i < 0 {
			i = len(bands)
			bands = append(bands, &band{row: pc.Row, rows: pc.Rows})
		}
		bands[i].parts = append(bands[i].parts, p.Index)
		bands[i].ins = append(bands[i].ins, mergeIn{key: yv, rows: pc.Rows, cols: pc.Cols})
	}
	for _, bd := range bands {
		// pieces were made in column order within a band
		w, err := appendMerge(out, n, bd.ins, bd.row*nCols*yElem, sp.Merge, bd.parts,
			fmt.Sprintf("merge [rows %d:%d]", bd.row, bd.row+bd.rows))
		if err != nil {
			return nil, err
		}
		writers = append(writers, w)
	}
	return writers, nil
}

// appendPart gives p its index and unit, appends it to out as a part of node n's split
// (splitPart: one groupParts may combine with its siblings) or as its merge, and returns its
// index; label names it in traces and refusals.
func appendPart(out *[]compiledPart, n *core.Node, p *Partition, unit int, offs []int64, label string, splitPart bool) int {
	p.Index, p.Device = len(*out), unit
	*out = append(*out, compiledPart{Partition: p, unit: unit, offs: offs, label: n.Name + " " + label,
		what: []string{fmt.Sprintf("node %s %s", n.Name, label)}, splitPart: splitPart})
	return p.Index
}

// mergeIn is one column piece of a split node's output that a merge reads: rows × cols of
// key's slot, from byte offset off.
type mergeIn struct {
	key        *core.Tensor
	off        int64
	rows, cols int64
}

// appendMerge appends the explicit merge of node n's column pieces (ins, in column order): a
// CONCAT along the columns on unit, after deps, writing n's output from byte offset yOff (more
// than maxConcat pieces: CONCATs of adjacent pieces first, in the same graph). It returns the
// merge's index.
func appendMerge(out *[]compiledPart, n *core.Node, ins []mergeIn, yOff int64, unit int, deps []int, label string) (int, error) {
	g := core.NewGraph()
	var views, keys []*core.Tensor
	var offs []int64
	for j, in := range ins {
		views = append(views, g.Input(fmt.Sprintf("%s.part%d", n.Name, j), n.Output.DType, in.rows, in.cols))
		keys = append(keys, in.key)
		offs = append(offs, in.off)
	}
	for level := 0; len(views) > maxConcat; level++ {
		var wider []*core.Tensor
		for i := 0; i < len(views); i += maxConcat {
			wider = append(wider, g.Named(fmt.Sprintf("%s.merge%d.%d", n.Name, level, i/maxConcat)).
				Concat(1, views[i:min(i+maxConcat, len(views))]...))
		}
		views = wider
	}
	g.Output(g.Named(n.Name+".merge").Concat(1, views...))
	if err := g.Err(); err != nil {
		return 0, fmt.Errorf("split of %s: merge: %w", n, err)
	}
	p := &Partition{Nodes: []int{n.ID}, Graph: g, Inputs: keys, Outputs: []*core.Tensor{n.Output}, Deps: deps}
	return appendPart(out, n, p, unit, append(offs, yOff), label, false), nil
}

// prepareSteal builds a stealing task's chunk partitions for its unit, checks and prepares
// them. Both sides of a task build the same chunks (the cut depends on its nodes only). An
// adaptive task's parts are prepared widest first (the front's last cut point, the back's
// first): the narrower ones are rows of it, which a backend that repacks weights serves out of
// the widest one's copy (abi's containing constants, neon's repacked views).
func (rt *Runtime) prepareSteal(ctx context.Context, c *compiledPart, prepOpts map[int]map[string]string) error {
	chunks, err := buildStealChunks(*c)
	if err != nil {
		return err
	}
	c.steal.chunks = chunks
	c.steal.state.n = len(chunks)
	order := make([]int, len(chunks))
	for i := range order {
		order[i] = i
	}
	if c.steal.adapt && c.steal.side == 0 {
		slices.Reverse(order)
	}
	for _, i := range order {
		ch := &chunks[i]
		if err := rt.analyzePart(ctx, ch.Graph, ch.unit, ch.what); err != nil {
			return err
		}
		if ch.exe, err = rt.preparePart(ctx, ch.Graph, ch.unit, prepOpts); err != nil {
			return fmt.Errorf("unit %s: prepare %s %s: %w", rt.units[ch.unit].Name(), c.label, ch.label, err)
		}
	}
	return nil
}

// prepareShared analyzes and prepares a shared-pieces side's chunks on its unit.
func (rt *Runtime) prepareShared(ctx context.Context, c *compiledPart, prepOpts map[int]map[string]string) error {
	for i := range c.steal.chunks {
		ch := &c.steal.chunks[i]
		if err := rt.analyzePart(ctx, ch.Graph, ch.unit, ch.what); err != nil {
			return err
		}
		var err error
		if ch.exe, err = rt.preparePart(ctx, ch.Graph, ch.unit, prepOpts); err != nil {
			return fmt.Errorf("unit %s: prepare %s %s: %w", rt.units[ch.unit].Name(), c.label, ch.label, err)
		}
	}
	return nil
}

// maxConcat is the most inputs one CONCAT takes (abi/OPS.md).
const maxConcat = 8

// splitMatMul is node n's MATMUL (its int8 form where the weights are I8) over one part's
// a and b, the op every split part runs.
func splitMatMul(g *core.Graph, n *core.Node, av, bv *core.Tensor) *core.Tensor {
	if n.Inputs[1].DType == core.I8 {
		return g.MatMulI8(av, bv, n.FAttr[0])
	}
	return g.MatMul(av, bv)
}
