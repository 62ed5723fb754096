package sched

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/xpuhub/xpu/sched/dag"
)

// RunStats is what one request (Program.Run) did: its wall time, each unit's busy time in it,
// and the bubble rate of its busiest unit: the share of the request's wall time that unit sat
// idle (waiting for another unit, or with nothing queued). 0 means the busiest unit never
// waited; the out-of-order dispatch exists to push it down.
type RunStats struct {
	Wall time.Duration
	// Busy is per runtime unit.
	Busy    []time.Duration
	Busiest int
	Bubble  float64
	// PredictedBubble and PredictedMakespan are the dispatch simulation's figures for the
	// request (from earlier runs' durations; 0 when it was not simulated, as on a runtime of
	// one unit, which runs the tasks in their order): predictions.
	PredictedBubble   float64
	PredictedMakespan time.Duration
	// Cut is the first unit's share of the rows at the cut the program's adaptive splits ran
	// (NodeSplit.Adapt); 0 when it has none.
	Cut float64
}

// CutRuns is how many requests of a phase ran their adaptive splits at one cut.
type CutRuns struct {
	Share float64 // the first unit's share of the rows
	Runs  int64
}

// PhaseStats adds up the requests of one phase (all programs of that phase on the runtime).
type PhaseStats struct {
	Phase Phase
	Runs  int64
	Wall  time.Duration
	// Busy is per runtime unit, in Units order.
	Busy []time.Duration
	// Busiest names the unit with the most busy time; Bubble is its idle share of Wall.
	Busiest string
	Bubble  float64
	// PredictedBubble is the dispatch simulations' bubble over the same requests (predicted).
	PredictedBubble float64
	// Cuts are the cuts the phase's adaptive splits ran at, by share, ascending (none
	// without adaptive splits).
	Cuts []CutRuns

	predIdle, predSpan time.Duration
	cuts               map[float64]int64
}

// bubble is the idle share of wall of the unit busiest in busy.
func bubble(wall time.Duration, busy []time.Duration) (int, float64) {
	b := 0
	for u := range busy {
		if busy[u] > busy[b] {
			b = u
		}
	}
	if wall <= 0 || len(busy) == 0 {
		return b, 0
	}
	return b, max(float64(wall-busy[b])/float64(wall), 0)
}

// recordRun keeps the stats of a finished request: the program's last, the phase's totals,
// and a trace slice with the bubble rate.
func (rt *Runtime) recordRun(p *Program, start, end time.Time, jobs []*rtJob, sim *dag.Result, cut float64) {
	rs := RunStats{Wall: end.Sub(start), Busy: make([]time.Duration, len(rt.units)), Cut: cut}
	for u, j := range jobs {
		if j != nil {
			rs.Busy[u] = j.busy
		}
	}
	rs.Busiest, rs.Bubble = bubble(rs.Wall, rs.Busy)
	if sim != nil {
		rs.PredictedBubble, rs.PredictedMakespan = sim.Bubble, sim.Makespan
	}
	rt.mu.Lock()
	p.last = rs
	if rt.phases == nil {
		rt.phases = map[Phase]*PhaseStats{}
	}
	ps := rt.phases[p.phase]
	if ps == nil {
		ps = &PhaseStats{Phase: p.phase, Busy: make([]time.Duration, len(rt.units))}
		rt.phases[p.phase] = ps
	}
	ps.Runs++
	ps.Wall += rs.Wall
	for u, d := range rs.Busy {
		ps.Busy[u] += d
	}
	if sim != nil {
		ps.predSpan += sim.Makespan
		ps.predIdle += sim.Idle[sim.Busiest]
	}
	if cut > 0 {
		if ps.cuts == nil {
			ps.cuts = map[float64]int64{}
		}
		ps.cuts[cut]++
	}
	rt.mu.Unlock()
	if tr := rt.cfg.trace; tr != nil {
		args := map[string]any{"program": p.name, "bubble_rate": rs.Bubble, "busiest": rt.units[rs.Busiest].Name(),
			"wall_us": rs.Wall.Microseconds()}
		if sim != nil {
			args["predicted_bubble_rate"] = rs.PredictedBubble
			args["predicted_makespan_us"] = rs.PredictedMakespan.Microseconds()
		}
		if cut > 0 {
			args["cut"] = cut
		}
		tr.Slice("requests", p.name, start, end, args)
	}
}

// LastRun is the stats of the program's last request (zero before the first).
func (p *Program) LastRun() RunStats {
	p.rt.mu.Lock()
	defer p.rt.mu.Unlock()
	rs := p.last
	rs.Busy = slices.Clone(rs.Busy)
	return rs
}

// phaseStats copies the per-phase totals (rt.mu held), in phase order prefill, decode, others.
func (rt *Runtime) phaseStats() []PhaseStats {
	var out []PhaseStats
	for _, ps := range rt.phases {
		c := *ps
		c.Busy = slices.Clone(ps.Busy)
		var b int
		b, c.Bubble = bubble(c.Wall, c.Busy)
		c.Busiest = rt.units[b].Name()
		if ps.predSpan > 0 {
			c.PredictedBubble = float64(ps.predIdle) / float64(ps.predSpan)
		}
		c.cuts, c.Cuts = nil, nil
		for s, n := range ps.cuts {
			c.Cuts = append(c.Cuts, CutRuns{Share: s, Runs: n})
		}
		slices.SortFunc(c.Cuts, func(a, b CutRuns) int { return cmp.Compare(a.Share, b.Share) })
		out = append(out, c)
	}
	rank := func(p Phase) int {
		switch p {
		case PhasePrefill:
			return 0
		case PhaseDecode:
			return 1
		}
		return 2
	}
	slices.SortFunc(out, func(a, b PhaseStats) int {
		if d := rank(a.Phase) - rank(b.Phase); d != 0 {
			return d
		}
		return strings.Compare(string(a.Phase), string(b.Phase))
	})
	return out
}

// String is one line: the phase, its requests and wall time, and the busiest unit's bubble
// rate (measured, then the dispatch simulation's prediction).
func (ps PhaseStats) String() string {
	s := fmt.Sprintf("%-8s %5d runs, %9.1f ms: busiest unit %s, bubble rate %.1f%% (predicted %.1f%%)",
		ps.Phase, ps.Runs, float64(ps.Wall)/float64(time.Millisecond), ps.Busiest, 100*ps.Bubble, 100*ps.PredictedBubble)
	if len(ps.Cuts) > 0 {
		var parts []string
		for _, c := range ps.Cuts {
			parts = append(parts, fmt.Sprintf("%.3f×%d", c.Share, c.Runs))
		}
		s += "; adaptive cut (first unit's share × runs) " + strings.Join(parts, " ")
	}
	return s
}
