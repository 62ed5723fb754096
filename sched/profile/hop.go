package profile

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// hopOps is the length of the chain of tiny ops measureRuntimeHop runs.
const hopOps = 16

// measureRuntimeHop is what the runtime adds when a task hands its output to a task on another
// unit, beyond the kernels' own launch costs: a chain of hopOps tiny element-wise ops runs
// through a sched.Runtime over units a and b, once alternating between them (hopOps−1 handoffs,
// hopOps partitions) and once all on a (one partition); the difference per handoff, less a
// launch per extra partition, is the hop. It includes the signal handoff, the dispatch of a
// partition and the wake-up of a descheduled worker, under this machine's load. The result is
// the median of interleaved rounds, at least the bare signal handoff.
func measureRuntimeHop(ctx context.Context, a, b MeasureUnit, launch float64, minTime time.Duration) (time.Duration, error) {
	specs := []sched.UnitSpec{a.Unit.Spec(), b.Unit.Spec()}
	if specs[0].String() == specs[1].String() {
		return 0, fmt.Errorf("profile: hop: one unit twice: %w", core.ErrInvalidArgument)
	}
	rt, err := sched.NewRuntime(ctx, []core.Device{a.Unit.Device(), b.Unit.Device()}, specs)
	if err != nil {
		return 0, err
	}
	defer rt.Close()
	const n = 64
	x, err := rt.Arena().Alloc(n * 4)
	if err != nil {
		return 0, err
	}
	out, err := rt.Arena().Alloc(n * 4)
	if err != nil {
		return 0, err
	}
	g := core.NewGraph()
	v := g.Input("x", core.F32, n)
	for range hopOps {
		v = g.Add(v, v)
	}
	g.Output(v)
	if err := g.Err(); err != nil {
		return 0, err
	}
	compile := func(name string, alternate bool) (*sched.Program, error) {
		units := make([]int, len(g.Nodes))
		for i := range units {
			if alternate {
				units[i] = i % 2
			}
		}
		return rt.Compile(ctx, sched.ProgramSpec{Name: name, Phase: sched.PhaseDecode, Lanes: 1,
			Stages: []sched.StageSpec{{Name: name, Graph: g, Units: units, IO: []sched.Binding{{Span: x}, {Span: out}}}}})
	}
	alt, err := compile("alternate", true)
	if err != nil {
		return 0, err
	}
	defer alt.Close()
	one, err := compile("one", false)
	if err != nil {
		return 0, err
	}
	defer one.Close()
	run := func(p *sched.Program) (time.Duration, error) {
		s := time.Now()
		err := p.Run(ctx, []sched.Chunk{{}})
		return time.Since(s), err
	}
	for _, p := range []*sched.Program{alt, one} { // warm-up (and the runtime's predictions)
		for range 3 {
			if _, err := run(p); err != nil {
				return 0, err
			}
		}
	}
	var diffs []time.Duration
	start := time.Now()
	for len(diffs) < 9 || (time.Since(start) < minTime && len(diffs) < 1000) {
		ta, err := run(alt)
		if err != nil {
			return 0, err
		}
		to, err := run(one)
		if err != nil {
			return 0, err
		}
		diffs = append(diffs, ta-to)
	}
	slices.Sort(diffs)
	// below zero when the units' launch costs, timed earlier, came out higher than the extra
	// partitions cost here (a loaded machine): the hop then adds nothing measurable to a launch,
	// and the caller's floor, the bare signal handoff, stands
	return max(diffs[len(diffs)/2]/(hopOps-1)-seconds(launch), 0), nil
}
