package dag

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Policy chooses which ready task a free unit runs next.
type Policy interface {
	// Name is the policy's name as flags and reports spell it.
	Name() string
	// Pick returns the index in ready (unit u's ready tasks, in ID order, never empty) of the
	// task u runs next, or -1 to leave u idle until the next task is released or finishes.
	Pick(d *Dispatcher, u int, ready []int) int
}

// InOrder runs each unit's tasks in the order they were added (chunk order, for DAGs built
// chunk by chunk): a unit whose next task is not ready waits, even when later tasks are. It is
// the baseline that leaves bubbles (mllm-NPU Fig. 13a: 37 % on the NPU).
var InOrder Policy = inOrder{}

// FIFO runs the ready task that was added first: a unit never idles while it has a ready task,
// but it does not look at what a task unlocks.
var FIFO Policy = fifo{}

// OutOfOrder is mllm-NPU's heuristic (§2.4 of the digest): among a unit's ready tasks, run the
// one whose completion most reduces the stall of the bottleneck unit (the unit with the most
// predicted work). For a candidate g, with S the tasks that become ready when g finishes,
//
//	C(g) = Σ_{k∈S, unit(k)=bottleneck} T_k − Σ_{k∈S, unit(k)≠bottleneck} T_k
//
// and the task with the largest C runs (the first added on ties). With two units whose tasks
// alternate this is the paper's rule exactly: a CPU/GPU task scores +Σ of the NPU work it
// unlocks, an NPU task −Σ of the CPU/GPU work it unlocks. With more units it generalizes the
// same way: work unlocked on the bottleneck counts for, work unlocked elsewhere against.
var OutOfOrder Policy = outOfOrder{}

// Policies lists the policies by name.
func Policies() []Policy { return []Policy{InOrder, FIFO, OutOfOrder} }

// PolicyByName returns the policy called name ("inorder", "fifo", "ooo"; case-insensitive).
func PolicyByName(name string) (Policy, error) {
	for _, p := range Policies() {
		if strings.EqualFold(p.Name(), name) {
			return p, nil
		}
	}
	names := make([]string, 0, 3)
	for _, p := range Policies() {
		names = append(names, p.Name())
	}
	return nil, fmt.Errorf("dag: unknown policy %q (there are: %s)", name, strings.Join(names, ", "))
}

type inOrder struct{}

func (inOrder) Name() string { return "inorder" }
func (inOrder) Pick(d *Dispatcher, u int, ready []int) int {
	// ready is in ID order, so the unit's next task is ready iff it is ready[0]
	if ready[0] == d.nextOf(u) {
		return 0
	}
	return -1
}

type fifo struct{}

func (fifo) Name() string                           { return "fifo" }
func (fifo) Pick(_ *Dispatcher, _ int, _ []int) int { return 0 }

type outOfOrder struct{}

func (outOfOrder) Name() string { return "ooo" }
func (outOfOrder) Pick(d *Dispatcher, _ int, ready []int) int {
	best, bestC := 0, time.Duration(0)
	for k, g := range ready {
		c := d.Contribution(g)
		if k == 0 || c > bestC {
			best, bestC = k, c
		}
	}
	return best
}

// Dispatcher tracks one run of a DAG: which tasks are done, running, ready (per unit), and
// picks a free unit's next task with a Policy. The runtime calls Next when a unit is free and
// Done when a task finishes; Simulate drives the same calls on a virtual clock. A Dispatcher is
// not safe for concurrent use.
type Dispatcher struct {
	d          *DAG
	pol        Policy
	bottleneck int
	pending    []int   // unfinished dependencies per task
	ready      [][]int // per unit, in ID order
	started    []bool
	done       []bool
	order      [][]int // per unit: its tasks in ID order (for InOrder)
	pos        []int   // per unit: index in order of its first task not started
	finished   int
}

// NewDispatcher starts a run of d with policy p: tasks without dependencies are ready.
func NewDispatcher(d *DAG, p Policy) (*Dispatcher, error) {
	if d == nil || p == nil {
		return nil, fmt.Errorf("%w: nil DAG or policy", ErrBadDAG)
	}
	n := len(d.Tasks)
	x := &Dispatcher{d: d, pol: p, bottleneck: d.Bottleneck(), pending: make([]int, n),
		ready: make([][]int, d.Units), started: make([]bool, n), done: make([]bool, n),
		order: make([][]int, d.Units), pos: make([]int, d.Units)}
	for i, t := range d.Tasks {
		x.pending[i] = len(t.Deps)
		x.order[t.Unit] = append(x.order[t.Unit], i)
		if len(t.Deps) == 0 {
			x.ready[t.Unit] = append(x.ready[t.Unit], i)
		}
	}
	return x, nil
}

// DAG is the graph being run.
func (x *Dispatcher) DAG() *DAG { return x.d }

// Bottleneck is the unit with the most predicted work (see DAG.Bottleneck).
func (x *Dispatcher) Bottleneck() int { return x.bottleneck }

// Ready is unit u's ready tasks in ID order (the caller must not modify it).
func (x *Dispatcher) Ready(u int) []int { return x.ready[u] }

// Finished reports whether every task is done.
func (x *Dispatcher) Finished() bool { return x.finished == len(x.d.Tasks) }

// Unlocks are the tasks that become ready when g finishes: its users whose only unfinished
// dependency is g.
func (x *Dispatcher) Unlocks(g int) []int {
	var out []int
	for _, k := range x.d.users[g] {
		if x.pending[k] == 1 {
			out = append(out, k)
		}
	}
	return out
}

// Contribution is mllm-NPU's C(g) (see OutOfOrder): the predicted bottleneck work g unlocks
// minus the other units' work it unlocks.
func (x *Dispatcher) Contribution(g int) time.Duration {
	var c time.Duration
	for _, k := range x.Unlocks(g) {
		if t := x.d.Tasks[k]; t.Unit == x.bottleneck {
			c += t.Cost
		} else {
			c -= t.Cost
		}
	}
	return c
}

// nextOf is the first task of unit u's ID order not started yet (-1 when none is left).
func (x *Dispatcher) nextOf(u int) int {
	for x.pos[u] < len(x.order[u]) && x.started[x.order[u][x.pos[u]]] {
		x.pos[u]++
	}
	if x.pos[u] == len(x.order[u]) {
		return -1
	}
	return x.order[u][x.pos[u]]
}

// Next picks the task free unit u runs now and marks it started, or returns -1 when u has
// nothing ready (or the policy keeps it idle until something else finishes).
func (x *Dispatcher) Next(u int) int {
	if u < 0 || u >= x.d.Units || len(x.ready[u]) == 0 {
		return -1
	}
	k := x.pol.Pick(x, u, x.ready[u])
	if k < 0 || k >= len(x.ready[u]) {
		return -1
	}
	g := x.ready[u][k]
	x.ready[u] = slices.Delete(x.ready[u], k, k+1)
	x.started[g] = true
	return g
}

// Done marks task g finished and makes the tasks it released ready, which it returns. Marking
// a task that was not started, or twice, is an error.
func (x *Dispatcher) Done(g int) ([]int, error) {
	rel, err := x.finish(g)
	for _, k := range rel {
		x.release(k)
	}
	return rel, err
}

// finish marks g done and returns the tasks whose dependencies are now all finished, without
// making them ready (Simulate delays them by the sync cost).
func (x *Dispatcher) finish(g int) ([]int, error) {
	if g < 0 || g >= len(x.d.Tasks) || !x.started[g] || x.done[g] {
		return nil, fmt.Errorf("%w: task %d finished but not running", ErrBadDAG, g)
	}
	x.done[g] = true
	x.finished++
	var rel []int
	for _, k := range x.d.users[g] {
		if x.pending[k]--; x.pending[k] == 0 {
			rel = append(rel, k)
		}
	}
	return rel, nil
}

// release puts k on its unit's ready queue, keeping ID order.
func (x *Dispatcher) release(k int) {
	u := x.d.Tasks[k].Unit
	i, _ := slices.BinarySearch(x.ready[u], k)
	x.ready[u] = slices.Insert(x.ready[u], i, k)
}
