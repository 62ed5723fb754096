package dag

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// ErrStalled is returned by Simulate when no unit can start anything and nothing is running,
// yet tasks remain (a policy that idles a unit forever).
var ErrStalled = errors.New("dag: schedule stalled")

// Slot is one task's place in a simulated schedule.
type Slot struct {
	Task       int
	Unit       int
	Start, End time.Duration
}

// Result is a simulated schedule. Every duration in it is predicted from the DAG's costs.
type Result struct {
	Policy   string
	Makespan time.Duration
	// Busy and Idle are per unit, over [0, Makespan].
	Busy, Idle []time.Duration
	// Busiest is the unit with the most busy time.
	Busiest int
	// Bubble is the busiest unit's idle share of the makespan: Idle[Busiest]/Makespan.
	Bubble float64
	// Slots are the tasks in start order (ties: lower unit first).
	Slots []Slot
	// Order is each unit's tasks in start order: what a runtime that runs per-unit queues in a
	// fixed order executes.
	Order [][]int
}

// SimOption configures Simulate.
type SimOption func(*simConfig)

type simConfig struct {
	sync     func(from, to int) time.Duration
	slowdown func(unit int) float64
}

// WithSync charges sync(from, to) between a task on unit from finishing and a dependent task
// on unit to becoming ready (from ≠ to): the cross-unit handoff (a fence, a flag poll, a queue
// re-submission). Tasks on one unit follow each other for free (queue order).
func WithSync(sync func(from, to int) time.Duration) SimOption {
	return func(c *simConfig) { c.sync = sync }
}

// WithSlowdown makes a unit's task run slowdown(unit) times slower (≥ 1) while any other unit
// runs a task too: units that share cores or a memory bus. A task's work is its Cost; it
// progresses at 1/slowdown while others run and at full speed alone (processor sharing).
func WithSlowdown(slowdown func(unit int) float64) SimOption {
	return func(c *simConfig) { c.slowdown = slowdown }
}

// Simulate replays d under policy p on a discrete-event clock: every unit runs one task at a
// time; when a unit is free the policy picks among its ready tasks; a task is ready when its
// dependencies have finished (plus the sync cost of a cross-unit dependency). The result is a
// prediction, never a measurement.
func Simulate(d *DAG, p Policy, opts ...SimOption) (*Result, error) {
	var cfg simConfig
	for _, o := range opts {
		o(&cfg)
	}
	x, err := NewDispatcher(d, p)
	if err != nil {
		return nil, err
	}
	n := len(d.Tasks)
	res := &Result{Policy: p.Name(), Busy: make([]time.Duration, d.Units), Idle: make([]time.Duration, d.Units),
		Order: make([][]int, d.Units), Slots: make([]Slot, 0, n)}
	end := make([]time.Duration, n)
	slot := make([]int, n)
	ver := make([]int, n) // a finish event is stale when its version is not the task's
	running := make([]int, d.Units)
	rem := make([]float64, d.Units) // the running task's work left, in ns at full speed
	rate := make([]float64, d.Units)
	for u := range running {
		running[u] = -1
	}
	var ev events
	now, last := time.Duration(0), time.Duration(0)
	advance := func(t time.Duration) {
		for u, g := range running {
			if g >= 0 {
				rem[u] -= float64(t-last) * rate[u]
			}
		}
		last = t
	}
	// reschedule sets each running task's rate (slowed while another unit runs) and, where it
	// changed, its finish event
	reschedule := func() {
		if cfg.slowdown == nil {
			return
		}
		busy := 0
		for _, g := range running {
			if g >= 0 {
				busy++
			}
		}
		for u, g := range running {
			if g < 0 {
				continue
			}
			r := 1.0
			if busy > 1 {
				r = 1 / max(cfg.slowdown(u), 1)
			}
			if r != rate[u] {
				rate[u] = r
				ver[g]++
				end[g] = now + time.Duration(math.Ceil(max(rem[u], 0)/r))
				heap.Push(&ev, event{at: end[g], task: g, finish: true, ver: ver[g]})
			}
		}
	}
	stale := func(e event) bool { return e.finish && e.ver != ver[e.task] }
	for !x.Finished() {
		for u := range running {
			if running[u] >= 0 {
				continue
			}
			g := x.Next(u)
			if g < 0 {
				continue
			}
			running[u] = g
			rem[u], rate[u] = float64(d.Tasks[g].Cost), 1
			end[g] = now + d.Tasks[g].Cost
			slot[g] = len(res.Slots)
			res.Slots = append(res.Slots, Slot{Task: g, Unit: u, Start: now})
			res.Order[u] = append(res.Order[u], g)
			heap.Push(&ev, event{at: end[g], task: g, finish: true, ver: ver[g]})
		}
		reschedule()
		for ev.Len() > 0 && stale(ev[0]) {
			heap.Pop(&ev)
		}
		if ev.Len() == 0 {
			return nil, fmt.Errorf("%w: %s at %v with %d of %d tasks done", ErrStalled, p.Name(), now, x.finished, n)
		}
		now = ev[0].at
		advance(now)
		for ev.Len() > 0 && ev[0].at == now {
			e := heap.Pop(&ev).(event)
			if stale(e) {
				continue
			}
			if !e.finish {
				x.release(e.task)
				continue
			}
			u := d.Tasks[e.task].Unit
			running[u] = -1
			sl := &res.Slots[slot[e.task]]
			sl.End = now
			res.Busy[u] += sl.End - sl.Start
			rel, err := x.finish(e.task)
			if err != nil {
				return nil, err
			}
			for _, k := range rel {
				at := now
				if cfg.sync != nil {
					for _, q := range d.Tasks[k].Deps {
						if from, to := d.Tasks[q].Unit, d.Tasks[k].Unit; from != to {
							at = max(at, end[q]+cfg.sync(from, to))
						}
					}
				}
				if at == now {
					x.release(k)
				} else {
					heap.Push(&ev, event{at: at, task: k})
				}
			}
		}
		res.Makespan = max(res.Makespan, now)
	}
	for u := range res.Busy {
		res.Idle[u] = res.Makespan - res.Busy[u]
		if res.Busy[u] > res.Busy[res.Busiest] {
			res.Busiest = u
		}
	}
	if res.Makespan > 0 {
		res.Bubble = float64(res.Idle[res.Busiest]) / float64(res.Makespan)
	}
	return res, nil
}

// String summarizes the result on one line (labelled predicted).
func (r *Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: makespan %v (predicted), bubble %.1f%% on unit %d; busy", r.Policy, r.Makespan, 100*r.Bubble, r.Busiest)
	for u, t := range r.Busy {
		fmt.Fprintf(&b, " u%d=%v", u, t)
	}
	return b.String()
}

// event is a task finishing or (after a sync delay) becoming ready.
type event struct {
	at     time.Duration
	task   int
	finish bool
	ver    int
}

// events is a min-heap by time; at one time, finishes come first (a finished unit is free
// before the tasks it released are queued), then by task ID, so runs are deterministic.
type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if e[i].at != e[j].at {
		return e[i].at < e[j].at
	}
	if e[i].finish != e[j].finish {
		return e[i].finish
	}
	return e[i].task < e[j].task
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(v any)   { *e = append(*e, v.(event)) }
func (e *events) Pop() any {
	old := *e
	v := old[len(old)-1]
	*e = old[:len(old)-1]
	return v
}
