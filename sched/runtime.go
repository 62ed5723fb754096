package sched

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched/cputopo"
	"github.com/xpuhub/xpu/sched/dag"
)

// Runtime runs programs — graphs cut into partitions over several units — on its units. It owns
// the units (their contexts), an Arena every unit imports, and one worker per unit: a goroutine
// locked to its OS thread that runs that unit's tasks in order, waiting on other units' Signals
// where a task consumes what another unit produced (no trip through the Go scheduler per edge).
//
// Requests (Program.Run) from several goroutines run concurrently where they use different
// units (one sequence's decode on one unit while another sequence's prefill runs on another);
// on a shared unit they run in the order they were dispatched. One Program runs one request at
// a time. Close the runtime after its programs' last Run.
type Runtime struct {
	cfg     runtimeConfig
	units   []*Unit
	mem     []*unitMem // per unit: its view of the arena
	arena   *Arena
	workers []*rtWorker
	pred    *Predictor[taskKey]

	runMu    sync.Mutex // dispatch: sequence numbers and job order agree on every unit
	inflight sync.WaitGroup
	mu       sync.Mutex // programs, closed
	programs []*Program
	closed   bool
	broken   error // a unit crashed: the runtime must be rebuilt

	copies, copyBytes atomic.Int64 // arena ↔ mirror copies for units that import nothing
	runs              atomic.Int64
	phases            map[Phase]*PhaseStats // under mu

	releaseProcs func()        // gives back the GOMAXPROCS headroom (nil: none taken)
	epochs       atomic.Uint32 // request chunks planned, for stealing tasks' claim words
}

type runtimeConfig struct {
	trace      *Trace
	logger     *slog.Logger
	policy     dag.Policy
	pinnedSpin time.Duration
	noHeadroom bool
}

// RuntimeOption configures NewRuntime.
type RuntimeOption func(*runtimeConfig)

// WithRuntimeTrace records every task, wait and copy in t (one track per unit).
func WithRuntimeTrace(t *Trace) RuntimeOption { return func(c *runtimeConfig) { c.trace = t } }

// WithDispatchPolicy sets the order in which each unit runs a request's tasks: the policy is
// run on a simulation with the durations earlier runs measured, and each unit's queue takes
// the simulated order. Default dag.OutOfOrder; dag.InOrder runs every unit's tasks in chunk
// order (the baseline that leaves bubbles).
func WithDispatchPolicy(p dag.Policy) RuntimeOption {
	return func(c *runtimeConfig) {
		if p != nil {
			c.policy = p
		}
	}
}

// WithPinnedSpin sets how long a unit's worker spins on another unit's signal before it
// blocks, when both workers are pinned to disjoint cores (units with a cpus option: the
// worker's thread is restricted to those CPUs), and the wait is not predicted to be longer.
// Default DefaultPinnedSpin; 0 blocks at once. Workers that are not both pinned keep the
// predicted sleep and the short spin of Signal.Wait.
func WithPinnedSpin(d time.Duration) RuntimeOption {
	return func(c *runtimeConfig) { c.pinnedSpin = max(d, 0) }
}

// WithProcHeadroom(false) stops the runtime from raising GOMAXPROCS. By default, while the
// runtime is open, GOMAXPROCS is at least one more than the workers of all open runtimes: a
// worker inside a backend call holds its P in the system-call state, and without an idle P
// Go's sysmon takes it away every 20 µs and wakes a thread that preempts a worker (procs.go
// says what that cost a split decode). The previous value comes back when the last runtime
// closes.
func WithProcHeadroom(on bool) RuntimeOption {
	return func(c *runtimeConfig) { c.noHeadroom = !on }
}

// WithRuntimeLogger sets the logger (default slog.Default()).
func WithRuntimeLogger(l *slog.Logger) RuntimeOption {
	return func(c *runtimeConfig) { c.logger = l }
}

// NewRuntime opens one unit per spec on the device of devices it names (FindDevice) and starts
// their workers.
func NewRuntime(ctx context.Context, devices []core.Device, specs []UnitSpec, opts ...RuntimeOption) (*Runtime, error) {
	cfg := runtimeConfig{logger: slog.Default(), policy: dag.OutOfOrder, pinnedSpin: DefaultPinnedSpin}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("runtime: no units: %w", core.ErrInvalidArgument)
	}
	rt := &Runtime{cfg: cfg, arena: NewArena(), pred: NewPredictor[taskKey](0)}
	for i, s := range specs {
		for _, prev := range specs[:i] {
			if prev.String() == s.String() {
				return nil, errors.Join(fmt.Errorf("runtime: unit %s given twice: %w", s, core.ErrInvalidArgument), rt.Close())
			}
		}
		dev, err := FindDevice(s, devices)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("runtime: %w", err), rt.Close())
		}
		u, err := OpenUnit(ctx, dev, s)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("runtime: %w", err), rt.Close())
		}
		rt.units = append(rt.units, u)
		rt.mem = append(rt.mem, &unitMem{mode: modeFor(dev.Info().Caps)})
		// buffered: dispatching a request never waits for a unit busy with an earlier one
		w := &rtWorker{rt: rt, idx: i, sig: NewSignal(), jobs: make(chan *rtJob, 64), exited: make(chan struct{}),
			pinned: make(chan struct{})}
		rt.workers = append(rt.workers, w)
		go w.loop()
		<-w.pinned
	}
	if !cfg.noHeadroom {
		rt.releaseProcs = reserveProcs(len(rt.workers))
	}
	return rt, nil
}

// Units are the runtime's units, in the order of the specs.
func (rt *Runtime) Units() []*Unit { return slices.Clone(rt.units) }

// Arena is the memory every unit sees.
func (rt *Runtime) Arena() *Arena { return rt.arena }

// Trace is the trace the runtime records into (nil: none).
func (rt *Runtime) Trace() *Trace { return rt.cfg.trace }

// Close stops the workers and releases every program, the arena imports, the arena and the
// units' contexts.
func (rt *Runtime) Close() error {
	rt.runMu.Lock()
	rt.mu.Lock()
	if rt.closed {
		rt.mu.Unlock()
		rt.runMu.Unlock()
		return nil
	}
	rt.closed = true
	progs := rt.programs
	rt.programs = nil
	rt.mu.Unlock()
	rt.runMu.Unlock()
	rt.inflight.Wait()
	var errs []error
	for _, w := range rt.workers {
		close(w.jobs)
		<-w.exited
	}
	if rt.releaseProcs != nil {
		rt.releaseProcs()
	}
	for _, p := range progs {
		errs = append(errs, p.release())
	}
	for _, m := range rt.mem {
		errs = append(errs, m.close())
	}
	errs = append(errs, rt.arena.Close())
	for _, u := range rt.units {
		errs = append(errs, u.Close())
	}
	if rt.broken != nil {
		// a crashed backend cannot release what it held: that is the crash, reported by Run
		errs = slices.DeleteFunc(errs, func(e error) bool { return errors.Is(e, core.ErrBackendCrashed) })
	}
	return errors.Join(errs...)
}

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
	lanes   []Span // per lane (same span repeated when shared)
	off     int64  // where the partition's tensor lies in the stage tensor's storage (a split's view)
	size    int64  // the partition's tensor's bytes
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
	rt.runMu.Lock()
	defer rt.runMu.Unlock()
	rt.mu.Lock()
	closed := rt.closed
	rt.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("runtime: compile: closed: %w", core.ErrBadState)
	}
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
		io := partIO{t: views[k], size: views[k].Bytes(), isInput: k < len(part.Inputs), slot: -1}
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

// Chunk is one run of a program's stages.
type Chunk struct {
	// Row moves every strided binding (Binding.Stride) by Row strides.
	Row int64
	// Rows are the rows of the bindings with a RowSlot (Binding.RowSlot k reads Rows[k-1]).
	Rows []int64
	// Index labels the chunk in traces.
	Index int
}

// rowOf is the row that moves io in this chunk: Row, or the row of its RowSlot.
func (c Chunk) rowOf(io partIO) (int64, error) {
	if io.rowSlot == 0 {
		return c.Row, nil
	}
	if io.rowSlot > len(c.Rows) {
		return 0, fmt.Errorf("%s is moved by row slot %d, the chunk has %d rows: %w", io.t.Name, io.rowSlot,
			len(c.Rows), core.ErrInvalidArgument)
	}
	return c.Rows[io.rowSlot-1], nil
}

// taskKey identifies a task for duration prediction: a partition of a program.
type taskKey struct {
	prog      *Program
	stage, pt int
}

// rtTask is one partition run for one chunk.
type rtTask struct {
	p           *Program
	stage, part int
	pp          *progPart
	lane        int
	chunk       Chunk
	seq         uint64
	waits       []uint64 // per unit: the sequence number to wait for (0: none)
	unitPos     int      // index in its unit's task list
	name        string
	epoch       uint32 // the request chunk's number, shared by a stealing task's two sides
	cut         int    // the cut point an adaptive task's two sides run (cutBalancer)
}

// rtJob is one request's tasks for one unit.
type rtJob struct {
	ctx context.Context
	// execCtx is what Execution.Run gets: the caller's context when it has a deadline (an
	// isolated backend's hung call is then killed), else Background, because a cancelable
	// context makes the ABI layer run each call on a goroutine of its own: a scheduler round
	// trip per task. Cancellation still stops the request between tasks and in every wait.
	execCtx context.Context
	cancel  context.CancelCauseFunc
	tasks   []*rtTask
	all     [][]*rtTask // every unit's tasks, for predictions
	wg      *sync.WaitGroup
	busy    time.Duration // time the unit spent running this job's tasks (read after wg.Wait)
}

// Run runs every stage for each chunk, in chunk order per unit, with up to Lanes chunks in
// flight. The caller has written the chunks' inputs into the arena. An error from any unit
// cancels the rest and is returned; a crashed (isolated) unit's core.ErrBackendCrashed marks
// the runtime broken: it must be closed and rebuilt.
func (p *Program) Run(ctx context.Context, chunks []Chunk) error {
	if len(chunks) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	rt := p.rt
	rt.runMu.Lock()
	rt.mu.Lock()
	closed, broken := rt.closed || p.released, rt.broken
	rt.mu.Unlock()
	switch {
	case closed:
		rt.runMu.Unlock()
		return fmt.Errorf("runtime: run %s: closed: %w", p.name, core.ErrBadState)
	case broken != nil:
		rt.runMu.Unlock()
		return fmt.Errorf("runtime: run: a unit crashed earlier, rebuild the runtime: %w", broken)
	}
	rt.inflight.Add(1)
	defer rt.inflight.Done()
	perUnit := p.plan(chunks)
	cut := 0.0 // the adaptive splits' cut this request runs, for its stats
	if p.cuts != nil {
		cut = p.cuts.shares[p.cuts.cur]
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	execCtx := context.Background()
	if _, ok := ctx.Deadline(); ok {
		execCtx = ctx
	}
	sim := p.sim
	var wg sync.WaitGroup
	jobs := make([]*rtJob, len(perUnit))
	start := time.Now()
	for u, tasks := range perUnit {
		if len(tasks) == 0 {
			continue
		}
		wg.Add(1)
		jobs[u] = &rtJob{ctx: runCtx, execCtx: execCtx, cancel: cancel, tasks: tasks, all: perUnit, wg: &wg}
		rt.workers[u].jobs <- jobs[u]
	}
	rt.runMu.Unlock()
	wg.Wait()
	rt.runs.Add(1)
	rt.recordRun(p, start, time.Now(), jobs, sim, cut)
	// cancel(nil) runs only on return: a cause now is a task's error or the caller's ctx
	if err := context.Cause(runCtx); err != nil {
		if errors.Is(err, core.ErrBackendCrashed) {
			rt.mu.Lock()
			rt.broken = err
			rt.mu.Unlock()
		}
		return err
	}
	return nil
}

// plan lays out the tasks of one request: their dependencies, the order each unit runs its
// tasks in, and the sequence numbers each task waits for on other units.
//
// Dependencies: a partition's producers in its stage; a stage's first partitions wait for
// every task of the chunk's previous stage and of the previous chunk's previous stage (the
// K/V rows attention reads), and a chunk's first stage for every task of the chunk that used
// its lane before. The order per unit comes from the dispatch policy run on a simulation with
// the durations earlier runs measured (simulate: by default mllm-NPU's out-of-order rule, from
// any chunk), so a unit idle in chunk i's dependency chain can work on chunk i+1. A simulated
// schedule respects every dependency, so the per-unit orders agree with each other and no unit
// ever waits on a task queued behind one of its own.
func (p *Program) plan(chunks []Chunk) [][]*rtTask {
	rt := p.rt
	nu := len(rt.units)
	var tasks []*rtTask
	var deps [][]int
	// sinks[i][s]: the tasks of chunk i's stage s that no later task of that stage needs
	sinks := make([][][]int, len(chunks))
	cut := 0
	if p.cuts != nil {
		cut = p.cuts.pick()
	}
	for ci, ch := range chunks {
		lane := ci % p.lanes
		epoch := rt.epochs.Add(1)
		sinks[ci] = make([][]int, len(p.stages))
		for si, st := range p.stages {
			first := len(tasks)
			for pi, pp := range st.parts {
				t := &rtTask{p: p, stage: si, part: pi, pp: pp, lane: lane, chunk: ch, waits: make([]uint64, nu),
					epoch: epoch, cut: cut}
				var d []int
				for _, q := range pp.Deps {
					d = append(d, first+q)
				}
				if len(pp.Deps) == 0 {
					switch {
					case si > 0:
						d = append(d, sinks[ci][si-1]...)
						if ci > 0 {
							d = append(d, sinks[ci-1][si-1]...)
						}
					case ci >= p.lanes:
						d = append(d, sinks[ci-p.lanes][len(p.stages)-1]...)
					}
				}
				tasks = append(tasks, t)
				deps = append(deps, d)
			}
			for _, q := range st.sinks {
				sinks[ci][si] = append(sinks[ci][si], first+q)
			}
		}
	}
	order, sim := p.simulate(tasks, deps)
	p.sim = sim
	perUnit := make([][]*rtTask, nu)
	for _, i := range order {
		t := tasks[i]
		w := rt.workers[t.pp.unit]
		w.issued++
		t.seq = w.issued
		t.unitPos = len(perUnit[t.pp.unit])
		perUnit[t.pp.unit] = append(perUnit[t.pp.unit], t)
	}
	for i, t := range tasks {
		for _, d := range deps[i] {
			if u := tasks[d].pp.unit; u != t.pp.unit {
				t.waits[u] = max(t.waits[u], tasks[d].seq)
			}
		}
	}
	return perUnit
}

// simulate replays the request's tasks on a virtual clock with their predicted durations (1 ms
// for a partition never run) under the runtime's dispatch policy (dag.OutOfOrder unless
// WithDispatchPolicy says otherwise: mllm-NPU's rule, a free unit runs the ready task that most
// reduces the bottleneck unit's stall, from any chunk) and returns the task indices in
// simulated start order, with the simulation (its figures are predictions). The simulator,
// the policy and the solver's replays are one code (package dag).
func (p *Program) simulate(tasks []*rtTask, deps [][]int) ([]int, *dag.Result) {
	inOrder := func() []int {
		order := make([]int, len(tasks))
		for i := range order {
			order[i] = i
		}
		return order
	}
	if len(p.rt.units) == 1 {
		// one unit runs its tasks back to back in any order the dependencies allow: the task
		// order is one, and no policy's order takes less time. The simulation cost ~15 µs a
		// request (a decode pass of stories260K is ~300 µs), and it would predict no bubble.
		return inOrder(), nil
	}
	d, err := dag.New(len(p.rt.units))
	if err != nil {
		return inOrder(), nil
	}
	for i, t := range tasks {
		c, ok := p.rt.pred.Predict(taskKey{t.p, t.stage, t.part})
		if !ok {
			c = time.Millisecond
		}
		if _, err := d.Add(dag.Task{Name: t.pp.name, Unit: t.pp.unit, Cost: c, Deps: deps[i], Chunk: t.chunk.Index,
			Layer: t.p.stages[t.stage].spec.Layer}); err != nil {
			// cannot happen: dependencies are earlier tasks by construction; the task order
			// is then still a valid schedule
			p.rt.cfg.logger.Debug("runtime: dispatch DAG", "err", err)
			return inOrder(), nil
		}
	}
	res, err := dag.Simulate(d, p.rt.cfg.policy)
	if err != nil {
		p.rt.cfg.logger.Debug("runtime: dispatch simulation", "err", err)
		return inOrder(), nil
	}
	order := make([]int, 0, len(tasks))
	for _, sl := range res.Slots {
		order = append(order, sl.Task)
	}
	return order, res
}

// rtWorker runs one unit's tasks on a goroutine locked to its OS thread.
type rtWorker struct {
	rt     *Runtime
	idx    int
	sig    *Signal
	issued uint64 // the highest sequence number handed out (under runMu)
	// cpus is the set the worker's thread is pinned to: its unit's cpus option, when the unit
	// has one and pinning worked (nil: the thread floats). Set before the first job.
	cpus   []int
	pinned chan struct{} // closed once cpus is settled
	jobs   chan *rtJob
	exited chan struct{}

	// the task running now, for other units' predictions
	curPos   atomic.Int64
	curStart atomic.Int64 // unix nanoseconds
	busy     atomic.Int64 // nanoseconds spent running tasks
	ran      atomic.Int64 // tasks run
	stolen   int          // chunks the last stealing task ran here (worker goroutine only)
}

func (w *rtWorker) loop() {
	defer close(w.exited)
	runtime.LockOSThread()
	// a pinned thread is never handed back to the Go scheduler's pool: it ends with the worker
	if !w.pin() {
		defer runtime.UnlockOSThread()
	}
	close(w.pinned)
	for j := range w.jobs {
		// predictions for this job start from its first task (not the last job's position)
		w.curPos.Store(-1)
		w.runJob(j)
		w.curPos.Store(-1)
		j.wg.Done()
	}
}

func (w *rtWorker) runJob(j *rtJob) {
	rt := w.rt
	u := rt.units[w.idx]
	tr := rt.cfg.trace
	for _, t := range j.tasks {
		if j.ctx.Err() != nil {
			return
		}
		for v, seq := range t.waits {
			if seq == 0 || rt.workers[v].sig.Load() >= seq {
				continue
			}
			start := time.Now()
			pred := rt.workers[v].remaining(j, v, seq)
			var err error
			if w.spinsOn(rt.workers[v]) {
				// a wait predicted to outlast the spin blocks at once: the core is then free
				// for whatever else the machine runs, and one wake-up is small beside it
				spin := rt.cfg.pinnedSpin
				if pred > spin {
					spin = 0
				}
				err = rt.workers[v].sig.WaitSpinning(j.ctx, seq, spin)
			} else {
				err = rt.workers[v].sig.Wait(j.ctx, seq, pred)
			}
			if err != nil {
				return // the request was cancelled: its cause is the error
			}
			if tr != nil {
				tr.Slice(u.Name(), "wait "+rt.units[v].Name(), start, time.Now(), map[string]any{
					"on": rt.units[v].Name(), "seq": seq, "predicted_us": pred.Microseconds(), "chunk": t.chunk.Index})
			}
		}
		w.curPos.Store(int64(t.unitPos))
		start := time.Now()
		w.curStart.Store(start.UnixNano())
		if err := w.runTask(j.execCtx, t); err != nil {
			j.cancel(fmt.Errorf("%s: %s (chunk %d): %w", u.Name(), t.pp.name, t.chunk.Index, err))
			return
		}
		end := time.Now()
		d := end.Sub(start)
		rt.pred.Observe(taskKey{t.p, t.stage, t.part}, d)
		w.busy.Add(int64(d))
		j.busy += d
		w.ran.Add(1)
		w.sig.Publish(t.seq)
		if tr != nil {
			args := map[string]any{"program": t.p.name, "chunk": t.chunk.Index,
				"layer": t.p.stages[t.stage].spec.Layer, "stage": t.p.stages[t.stage].spec.Name, "partition": t.part,
				"nodes": len(t.pp.Nodes), "lane": t.lane}
			switch {
			case t.pp.steal != nil && t.pp.steal.adapt:
				args["cut"] = t.p.cuts.shares[t.cut] // the first unit's share of the rows
			case t.pp.steal != nil:
				args["stolen_chunks"] = w.stolen // of len(t.pp.steal.chunks)
				args["chunks"] = len(t.pp.steal.chunks)
			}
			tr.Slice(u.Name(), t.pp.name, start, end, args)
		}
	}
}

// pin restricts the worker's (locked) thread to its unit's cpus option, so the unit's tasks run
// on the cores the unit was given, where the backend can run them on the calling thread; it
// says whether it did: not without a cpus option, or with one that is not a list of CPUs (the
// backend reports that when the context opens). A failed pin is logged at debug level: the
// thread then floats as before.
func (w *rtWorker) pin() bool {
	list, ok := w.rt.units[w.idx].Spec().Options["cpus"]
	if !ok {
		return false
	}
	cpus, err := cputopo.ParseCPUList(list)
	if err != nil || len(cpus) == 0 {
		return false
	}
	if err := pinThread(cpus); err != nil {
		w.rt.cfg.logger.Debug("runtime: worker thread not pinned", "unit", w.rt.units[w.idx].Name(), "err", err)
		return false
	}
	w.cpus = cpus
	return true
}

// DefaultPinnedSpin bounds the spin of a worker waiting for another unit when both are pinned
// to disjoint cores (see Signal.WaitSpinning, WithPinnedSpin): most of a decode step's waits
// are one partition of the other unit (0.05–2 ms); longer ones block, and so does a wait that
// earlier runs predict to be longer (a pipelined prefill's). Blocking instead costs
// a futex wake-up per wait: with 0 the 1B split decode here ran at half the speed.
const DefaultPinnedSpin = 2 * time.Millisecond

// spinsOn says whether this worker may spin on unit v's signal: both threads are pinned and
// share no core, so the spin cannot delay v.
func (w *rtWorker) spinsOn(v *rtWorker) bool {
	if w.cpus == nil || v.cpus == nil {
		return false
	}
	for _, c := range w.cpus {
		if slices.Contains(v.cpus, c) {
			return false
		}
	}
	return true
}

// remaining predicts how long until unit v publishes seq: the rest of the task running there
// plus the tasks queued before the awaited one, from earlier runs' durations.
func (w *rtWorker) remaining(j *rtJob, v int, seq uint64) time.Duration {
	tasks := j.all[v]
	pos := int(w.curPos.Load()) // -1: the unit has not started this job's first task
	var d time.Duration
	for k := max(pos, 0); k < len(tasks) && tasks[k].seq <= seq; k++ {
		key := taskKey{tasks[k].p, tasks[k].stage, tasks[k].part}
		if tasks[k].seq <= w.sig.Load() {
			continue // done
		}
		if k == pos {
			d += w.rt.pred.Remaining(key, time.Unix(0, w.curStart.Load()))
			continue
		}
		if e, ok := w.rt.pred.Predict(key); ok {
			d += e
		}
	}
	return d
}

// runTask binds what moves with the chunk, brings a copying unit's inputs in, runs, and takes
// its outputs out.
func (w *rtWorker) runTask(ctx context.Context, t *rtTask) error {
	if err := w.runPart(ctx, t, t.pp); err != nil {
		return err
	}
	if t.p.check != nil {
		return w.checkOutputs(t)
	}
	return nil
}

// runStolen runs a stealing task's side: chunks from its end of the rows until none are
// left (the other side takes the rest). It returns how many it ran.
func (w *rtWorker) runStolen(ctx context.Context, t *rtTask, st *progSteal) (int, error) {
	if st.adapt {
		start := time.Now()
		err := w.runPart(ctx, t, st.chunks[t.cut])
		t.p.cuts.observe(st.side, time.Since(start))
		return 1, err
	}
	ran := 0
	for {
		i := st.state.claim(t.lane, t.epoch, st.side)
		if i < 0 {
			return ran, nil
		}
		if err := w.runPart(ctx, t, st.chunks[i]); err != nil {
			return ran, err
		}
		ran++
	}
}

// runPart runs partition pp for task t (t.pp, or a chunk of it).
func (w *rtWorker) runPart(ctx context.Context, t *rtTask, pp *progPart) error {
	if pp.steal != nil {
		n, err := w.runStolen(ctx, t, pp.steal)
		w.stolen = n
		return err
	}
	rt := w.rt
	e := pp.execs[t.lane]
	m := rt.mem[pp.unit]
	u := rt.units[pp.unit]
	for k, io := range pp.io {
		if io.stride == 0 {
			continue
		}
		s := io.lanes[t.lane]
		buf, err := m.buffer(rt.arena, u, s.block)
		if err != nil {
			return err
		}
		row, err := t.chunk.rowOf(io)
		if err != nil {
			return err
		}
		off := s.Off + row*io.stride + io.off
		if off < s.Off || off+io.size > s.Off+s.Size {
			return fmt.Errorf("%s at row %d lies outside its span: %w", io.t.Name, row, core.ErrInvalidArgument)
		}
		if err := e.Bind(k, buf, off); err != nil {
			return fmt.Errorf("bind %s: %w", io.t.Name, err)
		}
	}
	if m.mode == importCopy {
		if err := w.copyIO(t, pp, true); err != nil {
			return err
		}
	}
	if err := e.Run(ctx); err != nil {
		return err
	}
	if m.mode == importCopy {
		if err := w.copyIO(t, pp, false); err != nil {
			return err
		}
	}
	return nil
}

// checkOutputs hands the task's floating-point outputs, as the arena holds them, to the
// program's Check.
func (w *rtWorker) checkOutputs(t *rtTask) error {
	for _, io := range t.pp.io {
		if io.isInput || (io.t.DType != core.F32 && io.t.DType != core.F16) {
			continue
		}
		s := io.lanes[t.lane]
		view := w.rt.arena.Bytes(s)
		row, err := t.chunk.rowOf(io)
		if err != nil {
			return err
		}
		off := row*io.stride + io.off
		if off < 0 || off+io.size > int64(len(view)) {
			return fmt.Errorf("%s at row %d lies outside its span: %w", io.t.Name, row, core.ErrInvalidArgument)
		}
		if err := t.p.check(t.stage, io.t, view[off:off+io.size]); err != nil {
			return err
		}
	}
	return nil
}

// copyIO moves a copying unit's partition inputs from the arena to its mirror (in) or its
// outputs back (out), counting the bytes.
func (w *rtWorker) copyIO(t *rtTask, pp *progPart, in bool) error {
	rt := w.rt
	u := rt.units[pp.unit]
	start := time.Now()
	var n int64
	for _, io := range pp.io {
		if io.isInput != in {
			continue
		}
		s := io.lanes[t.lane]
		row, err := t.chunk.rowOf(io)
		if err != nil {
			return err
		}
		off := s.Off + row*io.stride + io.off
		buf, err := rt.mem[pp.unit].buffer(rt.arena, u, s.block)
		if err != nil {
			return err
		}
		b, err := rt.arena.block(s.block)
		if err != nil {
			return err
		}
		host := b.mem[off : off+io.size]
		if in {
			err = buf.Write(off, host)
		} else {
			err = buf.Read(off, host)
		}
		if err != nil {
			return fmt.Errorf("copy %s: %w", io.t.Name, err)
		}
		n += io.size
		rt.copies.Add(1)
	}
	rt.copyBytes.Add(n)
	dir := "copy out"
	if in {
		dir = "copy in"
	}
	rt.cfg.trace.Slice(u.Name(), dir, start, time.Now(), map[string]any{"bytes": n, "chunk": t.chunk.Index})
	return nil
}

// UnitReport is one unit's share of the work.
type UnitReport struct {
	Unit   string
	Import string // how the unit sees the arena: "host pointer", "fd" or "copy"
	Tasks  int64
	Busy   time.Duration
}

// RuntimeReport is what a runtime did so far.
type RuntimeReport struct {
	Units []UnitReport
	Runs  int64
	// Copies and CopyBytes count the transfers between the arena and the units that import
	// nothing (0 when every unit imports it).
	Copies, CopyBytes int64
	ArenaBytes        int64
	// Phases are the requests per phase with the busiest unit's bubble rate (prefill first).
	Phases []PhaseStats
}

// Report describes the runtime's units and counters. It is safe to call at any time.
func (rt *Runtime) Report() RuntimeReport {
	r := RuntimeReport{Runs: rt.runs.Load(), Copies: rt.copies.Load(), CopyBytes: rt.copyBytes.Load(),
		ArenaBytes: rt.arena.Size()}
	rt.mu.Lock()
	r.Phases = rt.phaseStats()
	rt.mu.Unlock()
	for i, u := range rt.units {
		w := rt.workers[i]
		r.Units = append(r.Units, UnitReport{Unit: u.Name(), Import: rt.mem[i].mode.String(), Tasks: w.ran.Load(),
			Busy: time.Duration(w.busy.Load())})
	}
	return r
}

// String prints one line per unit.
func (r RuntimeReport) String() string {
	var b strings.Builder
	for _, u := range r.Units {
		fmt.Fprintf(&b, "  %-28s arena by %-12s %6d tasks, busy %8.1f ms\n", u.Unit, u.Import, u.Tasks,
			float64(u.Busy)/float64(time.Millisecond))
	}
	fmt.Fprintf(&b, "  %d runs; %d copies (%d bytes) between the arena and units that cannot import it", r.Runs,
		r.Copies, r.CopyBytes)
	return b.String()
}

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
