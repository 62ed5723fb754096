// Package dag is the task graph of one request and the policies that dispatch it: tasks
// (a partition of a stage for one chunk, or one part of a split operator) with a unit, a
// predicted cost and dependencies; per-unit ready queues; a Policy that picks which ready task
// a free unit runs next; and a discrete-event Simulate that replays a DAG on a virtual clock
// and reports the makespan, per-unit busy and idle time and the bubble rate.
//
// The package is pure (no devices, no goroutines, no wall clock): the runtime builds a DAG
// with its own predicted costs and either takes the simulated order or drives a Dispatcher
// online (Next when a unit is free, Done when a task finishes); the solver and the SoC
// simulation replay the same DAGs with predicted costs. Every figure Simulate returns is a
// prediction from the costs it was given.
package dag

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// ErrBadDAG is wrapped by every error about a malformed DAG (unknown unit, dependency on a
// task not yet added, negative cost).
var ErrBadDAG = errors.New("dag: malformed task graph")

// Task is one schedulable piece of work: it runs on one unit, takes Cost (predicted), and may
// start once every task in Deps has finished.
type Task struct {
	// ID is the task's index in DAG.Tasks; Add assigns it.
	ID int
	// Name labels the task in schedules and traces ("c3/blk.5.ffn_down#npu").
	Name string
	// Unit is the index of the unit that runs the task.
	Unit int
	// Cost is the predicted duration.
	Cost time.Duration
	// Deps are the IDs of the tasks that must finish first; each is smaller than ID.
	Deps []int
	// Chunk is the prefill chunk the task belongs to (0 for decode).
	Chunk int
	// Layer is the model layer (or stage) of the task; in-order dispatch runs a unit's tasks
	// in (Chunk, Layer, ID) order.
	Layer int
}

// DAG is a task graph over Units units. Tasks are added in an order where every dependency
// comes first, so a DAG is acyclic by construction.
type DAG struct {
	Units int
	Tasks []Task
	users [][]int // users[i]: the tasks that depend on i
}

// New makes an empty DAG over units units.
func New(units int) (*DAG, error) {
	if units < 1 {
		return nil, fmt.Errorf("%w: %d units", ErrBadDAG, units)
	}
	return &DAG{Units: units}, nil
}

// Add appends t (its ID is set to its index, which Add returns). Every dependency must be a
// task already added, the unit must be in range and the cost not negative. Duplicate
// dependencies are kept once.
func (d *DAG) Add(t Task) (int, error) {
	id := len(d.Tasks)
	if t.Unit < 0 || t.Unit >= d.Units {
		return -1, fmt.Errorf("%w: task %d (%s): unit %d of %d", ErrBadDAG, id, t.Name, t.Unit, d.Units)
	}
	if t.Cost < 0 {
		return -1, fmt.Errorf("%w: task %d (%s): negative cost %v", ErrBadDAG, id, t.Name, t.Cost)
	}
	deps := make([]int, 0, len(t.Deps))
	for _, q := range t.Deps {
		if q < 0 || q >= id {
			return -1, fmt.Errorf("%w: task %d (%s): dependency %d is not an earlier task", ErrBadDAG, id, t.Name, q)
		}
		if !slices.Contains(deps, q) {
			deps = append(deps, q)
		}
	}
	t.ID, t.Deps = id, deps
	d.Tasks = append(d.Tasks, t)
	d.users = append(d.users, nil)
	for _, q := range deps {
		d.users[q] = append(d.users[q], id)
	}
	return id, nil
}

// MustAdd is Add for DAGs built by code whose indices are correct by construction (tests,
// generators); it panics on an error.
func (d *DAG) MustAdd(t Task) int {
	id, err := d.Add(t)
	if err != nil {
		panic(err)
	}
	return id
}

// Users are the tasks that depend on task i.
func (d *DAG) Users(i int) []int { return d.users[i] }

// Work is each unit's total predicted cost.
func (d *DAG) Work() []time.Duration {
	w := make([]time.Duration, d.Units)
	for _, t := range d.Tasks {
		w[t.Unit] += t.Cost
	}
	return w
}

// Bottleneck is the unit with the most predicted work (the lowest index on ties): the unit
// whose stalls lengthen the schedule, which the out-of-order policy keeps busy.
func (d *DAG) Bottleneck() int {
	w := d.Work()
	b := 0
	for u := range w {
		if w[u] > w[b] {
			b = u
		}
	}
	return b
}

// CriticalPath is the longest chain of predicted costs through the DAG (ignoring units): no
// schedule is shorter.
func (d *DAG) CriticalPath() time.Duration {
	fin := make([]time.Duration, len(d.Tasks))
	var best time.Duration
	for i, t := range d.Tasks {
		var s time.Duration
		for _, q := range t.Deps {
			s = max(s, fin[q])
		}
		fin[i] = s + t.Cost
		best = max(best, fin[i])
	}
	return best
}
