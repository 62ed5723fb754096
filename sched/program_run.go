package sched

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched/dag"
)

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
	// failed is the request's first task error: when the caller's ctx ended the request
	// first, it still says which partition on which unit the cancellation stopped
	failed *atomic.Pointer[error]
	tasks  []*rtTask
	all    [][]*rtTask // every unit's tasks, for predictions
	wg     *sync.WaitGroup
	busy   time.Duration // time the unit spent running this job's tasks (read after wg.Wait)
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
	var failed atomic.Pointer[error]
	jobs := make([]*rtJob, len(perUnit))
	start := time.Now()
	for u, tasks := range perUnit {
		if len(tasks) == 0 {
			continue
		}
		wg.Add(1)
		jobs[u] = &rtJob{ctx: runCtx, execCtx: execCtx, cancel: cancel, failed: &failed, tasks: tasks, all: perUnit,
			wg: &wg}
		rt.workers[u].jobs <- jobs[u]
	}
	rt.runMu.Unlock()
	wg.Wait()
	rt.runs.Add(1)
	rt.recordRun(p, start, time.Now(), jobs, sim, cut)
	// cancel(nil) runs only on return: a cause now is a task's error or the caller's ctx
	if err := context.Cause(runCtx); err != nil {
		if f := failed.Load(); f != nil && errors.Is(*f, err) {
			err = *f
		}
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
