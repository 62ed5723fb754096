package sched

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched/dag"
)

// Binding places a graph input or output of a stage in the arena.
type Binding struct {
	// Span is where the tensor lives; Lanes, when set, gives one span per lane instead (an
	// activation each chunk in flight has its own copy of).
	Span  Span
	Lanes []Span
	// Stride moves the binding by Stride bytes per row of the run's Chunk.Row: a KV cache's
	// rows, or per-position inputs (token ids, RoPE tables).
	Stride int64
	// RowSlot, when positive, moves the binding by Chunk.Rows[RowSlot-1] strides instead of
	// Chunk.Row: in a batched step every sequence reads its own cache and writes its new K/V
	// row at its own position, so each binding needs a row of its own.
	RowSlot int
}

// StageSpec is one graph of a program.
type StageSpec struct {
	// Name and Layer label the stage's tasks in traces and errors.
	Name  string
	Layer int
	Graph *core.Graph
	// Units gives each node (by ID) a unit index; Fallback, if not nil, a unit for a node its
	// unit refuses (-1: none, the refusal is an error).
	Units    []int
	Fallback []int
	// Splits, if not nil, gives a MATMUL node (by ID) a split across units (nil: none); its
	// Units entry is then unused. See split_runtime.go.
	Splits []*NodeSplit
	// IO binds Graph.Inputs then Graph.Outputs.
	IO []Binding
	// Sharded says the graph holds shards of a layer that run at once on several units
	// (PlanShards): the stage is cut so that a unit's shard waits only for what it reads, at
	// the cost of more partitions (see splitGraphGrouped).
	Sharded bool
	// Shared lists pieces, each a group of node IDs with outputs of its own, that either of
	// the two units SharedUnits may run: they run as one stealing task, the first unit taking
	// pieces from the front and the second from the back until none is left (split_steal.go),
	// so a unit that is slower in this step runs fewer of them. Their Units entries are unused.
	Shared      [][]int
	SharedUnits [2]int
}

// ProgramSpec is a sequence of stages that runs once per chunk: stage s+1 starts after stage s
// (they exchange activations through lane spans), and chunk i's stage s after chunk i-1's stage
// s-1 (stage s reads what earlier chunks wrote at stage s-1: the KV cache). With Lanes > 1, up
// to Lanes chunks are in flight at once.
type ProgramSpec struct {
	Name   string
	Phase  Phase
	Lanes  int
	Stages []StageSpec
	// PrepareOptions are backend-specific prepare options per runtime unit index, passed as
	// core.WithPrepareOption to every Prepare of this program's partitions on that unit: two
	// programs on one context can differ in them (the neon plugin pins each executable's
	// workers by its own cpus= and threads=, so prefill and decode run on different cores of
	// one context, with no reallocation or repacking between them).
	PrepareOptions map[int]map[string]string
	// Progress, if set, is called after each stage is prepared.
	Progress func()
	// Check, if set, is given every floating-point output of every partition after each run
	// (stage index, tensor, its bytes in the arena) and fails the request with its error: a
	// debugging aid that names the first stage computing a NaN, at the cost of reading every
	// activation.
	Check func(stage int, t *core.Tensor, data []byte) error
}

// ErrPlanRefused wraps core.ErrUnsupported: a unit refuses a node the plan gives it.
var ErrPlanRefused = fmt.Errorf("plan refused: %w", core.ErrUnsupported)

// Program is a ProgramSpec partitioned, checked and prepared on the runtime's units, with its
// activation slots assigned.
type Program struct {
	rt     *Runtime
	name   string
	phase  Phase
	lanes  int
	stages []*progStage
	// nodes counts the nodes placed on each unit, by op, for Placement.
	nodes    []map[core.Op]int
	released bool // Close was called (under rt.mu)
	check    func(stage int, t *core.Tensor, data []byte) error
	sim      *dag.Result  // the last request's simulated schedule (under rt.runMu)
	last     RunStats     // the last request's measured stats (under rt.mu)
	cuts     *cutBalancer // picks the cut of the program's adaptive splits; nil: it has none
}

type progStage struct {
	spec  StageSpec
	parts []*progPart
	sinks []int // partitions nothing later in the stage depends on
}

// progPart is one partition: a prepared executable and one execution per lane.
type progPart struct {
	*Partition
	unit  int
	name  string
	exe   core.Executable
	execs []core.Execution // per lane
	io    []partIO         // per partition input then output
	steal *progSteal       // a stealing split's task: it runs these chunks, exe is nil
}

// progSteal is a stealing task's side, shared claim word and chunks (split_steal.go), or an
// adaptive task's side and its part at each cut point (adapt).
type progSteal struct {
	side   int
	adapt  bool
	state  *stealState
	chunks []*progPart
}

// allParts are the stage's partitions and the chunks of its stealing tasks: everything that
// holds executions.
func (st *progStage) allParts() []*progPart {
	var all []*progPart
	for _, pp := range st.parts {
		all = append(all, pp)
		if pp.steal != nil {
			all = append(all, pp.steal.chunks...)
		}
	}
	return all
}

// partIO is where a partition's input or output lives.
type partIO struct {
	t       *core.Tensor
	src     *core.Tensor // the stage graph's tensor t stands for (t itself, or the one a split views)
	lanes   []Span       // per lane (same span repeated when shared)
	off     int64        // where the partition's tensor lies in the stage tensor's storage (a split's view)
	size    int64        // the partition's tensor's bytes
	stride  int64
	rowSlot int // Binding.RowSlot
	isInput bool
	slot    int // an activation slot (index into Compile's slot uses), or -1
}

// Compile partitions each stage graph by its node units, checks every partition on its unit
// (Context.Analyze: a refused node fails here, naming node, unit and reason, before anything
// runs), prepares it, gives the tensors that cross partitions arena slots, and binds one
// execution per lane.
func (rt *Runtime) Compile(ctx context.Context, spec ProgramSpec) (_ *Program, err error) {
	// the units' arena views are the workers' while a request runs
	if err := rt.lockRun("compile"); err != nil {
		return nil, err
	}
	defer rt.runMu.Unlock()
	lanes := max(spec.Lanes, 1)
	p := &Program{rt: rt, name: spec.Name, phase: spec.Phase, lanes: lanes, check: spec.Check, nodes: make([]map[core.Op]int, len(rt.units))}
	for i := range p.nodes {
		p.nodes[i] = map[core.Op]int{}
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.release())
		}
	}()
	// Cross-partition tensors of stage s go to slot group s%2 of each lane: stage s+2 reuses
	// stage s's slots, and it starts only after every task of stage s+1, which started after
	// every task of stage s.
	var uses []*slotUse
	groupSize := [2]int64{}
	for si, st := range spec.Stages {
		ps, err := rt.partition(ctx, st, spec.PrepareOptions)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", st.Name, err)
		}
		pst := &progStage{spec: st}
		bound := map[*core.Tensor]Binding{}
		for i, t := range st.Graph.Inputs {
			bound[t] = st.IO[i]
		}
		for i, t := range st.Graph.Outputs {
			bound[t] = st.IO[len(st.Graph.Inputs)+i]
		}
		var used int64
		slot := map[*core.Tensor]*slotUse{}
		hasLater := make([]bool, len(ps))
		for _, part := range ps {
			for _, d := range part.Deps {
				hasLater[d] = true
			}
			label := part.label
			if label == "" {
				label = partLabel(part.Partition, st.Graph)
			}
			pp := &progPart{Partition: part.Partition, unit: part.unit, exe: part.exe,
				name: fmt.Sprintf("%s/p%d %s", st.Name, part.Index, label)}
			pst.parts = append(pst.parts, pp)
			for _, n := range part.Graph.Nodes {
				p.nodes[part.unit][n.Op]++
			}
			if pp.io, err = partIOs(part, bound, lanes, slot, func(t *core.Tensor) *slotUse {
				u := &slotUse{idx: len(uses), t: t, off: used}
				used += alignUp(max(t.Bytes(), 1), arenaAlign)
				uses = append(uses, u)
				return u
			}); err != nil {
				return nil, fmt.Errorf("%s: %w", st.Name, err)
			}
			if part.steal != nil {
				pp.steal = &progSteal{side: part.steal.side, adapt: part.steal.adapt, state: part.steal.state}
				if part.steal.adapt && p.cuts == nil {
					p.cuts = newCutBalancer(part.steal.share)
				}
				if len(pp.steal.state.words) < lanes { // both sides share the state
					pp.steal.state.words = make([]atomic.Uint64, lanes)
				}
				for _, ch := range part.steal.chunks {
					cp := &progPart{Partition: ch.Partition, unit: ch.unit, exe: ch.exe,
						name: fmt.Sprintf("%s/p%d %s", st.Name, part.Index, ch.label)}
					if cp.io, err = partIOs(ch, bound, lanes, slot, nil); err != nil {
						return nil, fmt.Errorf("%s: %w", st.Name, err)
					}
					pp.steal.chunks = append(pp.steal.chunks, cp)
				}
			}
		}
		for i := range ps {
			if !hasLater[i] {
				pst.sinks = append(pst.sinks, i)
			}
		}
		groupSize[si%2] = max(groupSize[si%2], used)
		p.stages = append(p.stages, pst)
		if spec.Progress != nil {
			spec.Progress()
		}
	}
	// The slot groups, per lane.
	groups := make([][2]Span, lanes)
	for l := range lanes {
		for g := range 2 {
			if groupSize[g] > 0 {
				if groups[l][g], err = rt.arena.Alloc(groupSize[g]); err != nil {
					return nil, fmt.Errorf("%s: activation slots: %w", spec.Name, err)
				}
			}
		}
	}
	for si, pst := range p.stages {
		for _, pp := range pst.allParts() {
			for k := range pp.io {
				io := &pp.io[k]
				if io.slot < 0 {
					continue
				}
				u := uses[io.slot]
				for l := range lanes {
					g := groups[l][si%2]
					io.lanes[l] = Span{block: g.block, Off: g.Off + u.off, Size: alignUp(max(u.t.Bytes(), 1), arenaAlign)}
				}
			}
			if err := rt.bindLanes(pp, lanes); err != nil {
				return nil, fmt.Errorf("%s: %w", pp.name, err)
			}
		}
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		return nil, fmt.Errorf("runtime: compile: closed: %w", core.ErrBadState)
	}
	rt.programs = append(rt.programs, p)
	return p, nil
}

// slotUse is an activation slot of a program: its index, the tensor it holds and its offset
// in its slot group.
type slotUse struct {
	idx int
	t   *core.Tensor
	off int64
}

// partIOs lays out where a partition's inputs and outputs live: a stage binding, or an
// activation slot (slot, by tensor; newSlot makes one for a tensor that has none yet, nil: it
// must exist already).
func partIOs(part compiledPart, bound map[*core.Tensor]Binding, lanes int, slot map[*core.Tensor]*slotUse,
	newSlot func(*core.Tensor) *slotUse) ([]partIO, error) {
	var ios []partIO
	views := slices.Concat(part.Graph.Inputs, part.Graph.Outputs)
	for k, t := range slices.Concat(part.Inputs, part.Outputs) {
		io := partIO{t: views[k], src: t, size: views[k].Bytes(), isInput: k < len(part.Inputs), slot: -1}
		if part.offs != nil {
			io.off = part.offs[k]
		}
		if b, ok := bound[t]; ok {
			if err := checkBinding(t, b); err != nil {
				return nil, err
			}
			io.stride, io.rowSlot = b.Stride, b.RowSlot
			for l := range lanes {
				if len(b.Lanes) > 0 {
					io.lanes = append(io.lanes, b.Lanes[l%len(b.Lanes)])
				} else {
					io.lanes = append(io.lanes, b.Span)
				}
			}
		} else {
			u := slot[t]
			if u == nil {
				if newSlot == nil {
					return nil, fmt.Errorf("%s has no activation slot: %w", t.Name, core.ErrInvalidArgument)
				}
				u = newSlot(t)
				slot[t] = u
			}
			io.lanes = make([]Span, lanes) // filled below, once the groups exist
			io.slot = u.idx
		}
		ios = append(ios, io)
	}
	return ios, nil
}

// checkBinding rejects a binding that cannot hold t: every span must, at row 0.
func checkBinding(t *core.Tensor, b Binding) error {
	spans := b.Lanes
	if len(spans) == 0 {
		spans = []Span{b.Span}
	}
	for _, s := range spans {
		if s.Size < t.Bytes() || s.Size == 0 || b.Stride < 0 || b.RowSlot < 0 {
			return fmt.Errorf("binding of %s (%d bytes): span of %d bytes, stride %d: %w", t.Name, t.Bytes(),
				s.Size, b.Stride, core.ErrInvalidArgument)
		}
	}
	return nil
}

// partLabel names a partition by its first node and size.
func partLabel(p *Partition, g *core.Graph) string {
	first := g.Nodes[p.Nodes[0]]
	if len(p.Nodes) == 1 {
		return first.Name
	}
	return fmt.Sprintf("%s +%d", first.Name, len(p.Nodes)-1)
}

// compiledPart is a partition checked and prepared on its unit.
type compiledPart struct {
	*Partition
	unit int
	exe  core.Executable
	// offs, for a part of a split MATMUL, gives each of Graph's inputs then outputs the byte
	// offset of its view in the stage tensor (Inputs, Outputs) it reads or writes; nil: 0.
	offs  []int64
	label string // for a split's parts; else partLabel
	// what names each node of a split's part or merge in refusals (nil: a partition of the
	// stage graph, analyzed with it); splitPart marks a part (not a merge), which may share a
	// task with sibling parts.
	what      []string
	splitPart bool
	// steal, for a stealing split's task, holds its chunks (split_steal.go): the task itself
	// is not prepared.
	steal *stealSpec
}

// partition splits a stage by unit, checks each partition where it goes and prepares it. A
// node its unit refuses moves to its fallback unit when it has one (then the stage is split
// again); otherwise the refusal is the error.
func (rt *Runtime) partition(ctx context.Context, st StageSpec, prepOpts map[int]map[string]string) ([]compiledPart, error) {
	g := st.Graph
	if g == nil || len(st.Units) != len(g.Nodes) || len(st.IO) != len(g.Inputs)+len(g.Outputs) {
		return nil, fmt.Errorf("stage %q: need a graph, a unit per node and a binding per input and output: %w",
			st.Name, core.ErrInvalidArgument)
	}
	units := slices.Clone(st.Units)
	for _, u := range units {
		if u < 0 || u >= len(rt.units) {
			return nil, fmt.Errorf("stage %q: unit index %d of %d units: %w", st.Name, u, len(rt.units), core.ErrInvalidArgument)
		}
	}
	splits, err := rt.checkSplits(st)
	if err != nil {
		return nil, err
	}
	// A split node is a partition of its own (a pseudo unit past the real ones), expanded
	// into its parts once the stage is cut.
	for id, sp := range splits {
		if sp != nil {
			units[id] = len(rt.units) + id
		}
	}
	if err := checkShared(st, splits, len(rt.units)); err != nil {
		return nil, err
	}
	// a shared piece is a partition of its own too, made into the stealing task's chunks
	for _, piece := range st.Shared {
		for _, id := range piece {
			units[id] = len(rt.units) + piece[0]
		}
	}
	for try := 0; ; try++ {
		group := make([]int, len(units))
		for i, u := range units {
			group[i] = min(u, len(rt.units)) // every split node in one group (splitGraphGrouped)
		}
		real := 0
		if st.Sharded {
			real = len(rt.units)
		}
		parts, err := splitGraphGrouped(g, units, group, real)
		if err != nil {
			return nil, err
		}
		moved := false
		var refusals []error
		for _, part := range parts {
			if part.Device >= len(rt.units) {
				continue // a split node: its parts are analyzed as they are made
			}
			u := rt.units[part.Device]
			vs, err := u.Context().Analyze(ctx, part.Graph)
			if err != nil {
				return nil, fmt.Errorf("unit %s: analyze partition %d: %w", u.Name(), part.Index, err)
			}
			for i, v := range vs {
				if v.Supported || i >= len(part.Nodes) {
					continue
				}
				id := part.Nodes[i]
				n := g.Nodes[id]
				if st.Fallback != nil && st.Fallback[id] >= 0 && st.Fallback[id] != units[id] && try == 0 {
					units[id] = st.Fallback[id]
					moved = true
					continue
				}
				refusals = append(refusals, fmt.Errorf("node %s (%s) on unit %s: %s", n.Name, n.Op, u.Name(), v.Reason))
			}
		}
		if len(refusals) > 0 {
			return nil, fmt.Errorf("%w: %w", ErrPlanRefused, errors.Join(refusals...))
		}
		if moved {
			continue
		}
		return rt.prepareStage(ctx, st, splits, parts, prepOpts)
	}
}

// bindLanes makes one execution per lane and binds what does not move between runs.
func (rt *Runtime) bindLanes(pp *progPart, lanes int) error {
	if pp.steal != nil {
		return nil // a stealing task runs its chunks' executions, it has none
	}
	for l := range lanes {
		e, err := pp.exe.NewExecution()
		if err != nil {
			return err
		}
		pp.execs = append(pp.execs, e)
		for k, io := range pp.io {
			if io.stride != 0 {
				continue // bound at every run
			}
			buf, err := rt.mem[pp.unit].buffer(rt.arena, rt.units[pp.unit], io.lanes[l].block)
			if err != nil {
				return err
			}
			if err := e.Bind(k, buf, io.lanes[l].Off+io.off); err != nil {
				return fmt.Errorf("bind %s: %w", io.t.Name, err)
			}
		}
	}
	return nil
}

// rebind moves graph input or output io of stage si (Graph.Inputs then Graph.Outputs order) to
// b from the next Run on: a Session's Execution binds the arena buffers its caller chose this
// way between runs. The program must not be running.
func (p *Program) rebind(si, io int, b Binding) error {
	rt := p.rt
	if err := rt.lockRun("rebind " + p.name); err != nil {
		return err
	}
	defer rt.runMu.Unlock()
	rt.mu.Lock()
	released := p.released
	rt.mu.Unlock()
	if released {
		return fmt.Errorf("runtime: rebind %s: closed: %w", p.name, core.ErrBadState)
	}
	if si < 0 || si >= len(p.stages) {
		return fmt.Errorf("runtime: rebind %s: no stage %d: %w", p.name, si, core.ErrInvalidArgument)
	}
	st := p.stages[si]
	t, err := st.spec.Graph.Binding(io)
	if err != nil {
		return fmt.Errorf("runtime: rebind %s: %w", p.name, err)
	}
	if err := checkBinding(t, b); err != nil {
		return fmt.Errorf("runtime: rebind %s: %w", p.name, err)
	}
	for _, pp := range st.allParts() {
		for k := range pp.io {
			pio := &pp.io[k]
			if pio.src != t {
				continue
			}
			pio.stride, pio.rowSlot = b.Stride, b.RowSlot
			for l := range pio.lanes {
				if len(b.Lanes) > 0 {
					pio.lanes[l] = b.Lanes[l%len(b.Lanes)]
				} else {
					pio.lanes[l] = b.Span
				}
			}
			if pio.stride != 0 {
				continue // bound at every run
			}
			for l, e := range pp.execs {
				buf, err := rt.mem[pp.unit].buffer(rt.arena, rt.units[pp.unit], pio.lanes[l].block)
				if err != nil {
					return err
				}
				if err := e.Bind(k, buf, pio.lanes[l].Off+pio.off); err != nil {
					return fmt.Errorf("runtime: rebind %s: %w", t.Name, err)
				}
			}
		}
	}
	return nil
}

// Close releases the program's executions and executables before the runtime closes (which
// releases every program). The program must not be running. Its arena spans stay: the arena
// is freed with the runtime.
func (p *Program) Close() error {
	rt := p.rt
	rt.runMu.Lock()
	defer rt.runMu.Unlock()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if p.released || rt.closed {
		return nil
	}
	p.released = true
	rt.programs = slices.DeleteFunc(rt.programs, func(q *Program) bool { return q == p })
	return p.release()
}

// release closes the program's executions and executables.
func (p *Program) release() error {
	var errs []error
	for _, st := range p.stages {
		for _, pp := range st.allParts() {
			for _, e := range pp.execs {
				errs = append(errs, e.Close())
			}
			pp.execs = nil
			if pp.exe != nil {
				errs = append(errs, pp.exe.Close())
				pp.exe = nil
			}
		}
	}
	return errors.Join(errs...)
}

// Name is the program's name.
func (p *Program) Name() string { return p.name }

// Lanes is how many chunks may be in flight at once.
func (p *Program) Lanes() int { return p.lanes }

// Placement prints which unit runs which ops in this program: one line per unit with node
// counts by op, and the partition count.
func (p *Program) Placement() string {
	var b strings.Builder
	parts := 0
	for _, st := range p.stages {
		parts += len(st.parts)
	}
	fmt.Fprintf(&b, "%s: %d stages, %d partitions, %d lane(s)\n", p.name, len(p.stages), parts, p.lanes)
	for u, ops := range p.nodes {
		if len(ops) == 0 {
			continue
		}
		keys := make([]core.Op, 0, len(ops))
		for o := range ops {
			keys = append(keys, o)
		}
		slices.Sort(keys)
		var cols []string
		for _, o := range keys {
			cols = append(cols, fmt.Sprintf("%s×%d", o, ops[o]))
		}
		fmt.Fprintf(&b, "  %-28s %s\n", p.rt.units[u].Name(), strings.Join(cols, " "))
	}
	return strings.TrimRight(b.String(), "\n")
}

// UnitNodes is, per unit index, how many nodes of this program it runs.
func (p *Program) UnitNodes() []int {
	out := make([]int, len(p.nodes))
	for u, ops := range p.nodes {
		for _, n := range ops {
			out[u] += n
		}
	}
	return out
}
