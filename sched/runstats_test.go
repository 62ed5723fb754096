package sched

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/sched/dag"
)

// TestRunStatsAndBubble: every request records its wall time, each unit's busy time and the
// busiest unit's bubble rate, in the program, the runtime's per-phase report and the trace;
// the dispatch order comes from the chosen policy's simulation.
func TestRunStatsAndBubble(t *testing.T) {
	for _, pol := range []dag.Policy{dag.OutOfOrder, dag.InOrder} {
		t.Run(pol.Name(), func(t *testing.T) {
			devs, pb := refAndPlugin(t)
			tr := NewTrace()
			rt, err := NewRuntime(context.Background(), devs, []UnitSpec{{Backend: "ref"}, {Backend: pb.Info().Name}},
				WithRuntimeTrace(tr), WithDispatchPolicy(pol))
			require.NoError(t, err)
			defer func() { require.NoError(t, rt.Close()) }()
			const n, rows = 64, 6
			p, x, out := twoStages(t, rt, n, rows, 2)
			writeRows(rt.Arena(), x, n, rows)
			var chunks []Chunk
			for i := range rows {
				chunks = append(chunks, Chunk{Row: int64(i), Index: i})
			}
			for range 2 { // the second run is simulated with measured durations
				require.NoError(t, p.Run(context.Background(), chunks))
			}
			expectRows(t, rt.Arena(), x, out, n, rows)
			rs := p.LastRun()
			require.Len(t, rs.Busy, 2)
			assert.Positive(t, rs.Wall)
			for u, b := range rs.Busy {
				assert.Positive(t, b, "unit %d", u)
				assert.LessOrEqual(t, b, rs.Wall, "unit %d busy within the request", u)
			}
			assert.Equal(t, rs.Busy[rs.Busiest], max(rs.Busy[0], rs.Busy[1]))
			assert.InDelta(t, float64(rs.Wall-rs.Busy[rs.Busiest])/float64(rs.Wall), rs.Bubble, 1e-9)
			assert.Positive(t, rs.PredictedMakespan)
			assert.Equal(t, pol.Name(), p.sim.Policy)

			rep := rt.Report()
			require.Len(t, rep.Phases, 1)
			ps := rep.Phases[0]
			assert.Equal(t, PhasePrefill, ps.Phase)
			assert.Equal(t, int64(2), ps.Runs)
			assert.GreaterOrEqual(t, ps.Bubble, 0.0)
			assert.Less(t, ps.Bubble, 1.0)
			assert.Contains(t, ps.String(), "bubble rate")
			file := filepath.Join(t.TempDir(), "trace.json")
			require.NoError(t, tr.WriteFile(file))
			evs, err := ReadTraceFile(file)
			require.NoError(t, err)
			var seen int
			for _, ev := range evs {
				if ev.Track == "requests" {
					seen++
					assert.Contains(t, ev.Args, "bubble_rate")
				}
			}
			assert.Equal(t, 2, seen, "one trace slice per request")
		})
	}
}

// TestOneUnitRunsInTaskOrder: a runtime of one unit runs a request's tasks in their order
// without simulating a dispatch (no order a policy picks can differ in time on one unit), so
// its requests have no predicted figures; the rows still come out right.
func TestOneUnitRunsInTaskOrder(t *testing.T) {
	rb := ref.New()
	defer rb.Close()
	rt, err := NewRuntime(context.Background(), rb.Devices(), []UnitSpec{{Backend: "ref"}})
	require.NoError(t, err)
	defer func() { require.NoError(t, rt.Close()) }()
	const n, rows = 16, 4
	p, x, out := twoStagesOn(t, rt, n, rows, 2, []int{0, 0, 0}, []int{0, 0})
	writeRows(rt.Arena(), x, n, rows)
	var chunks []Chunk
	for i := range rows {
		chunks = append(chunks, Chunk{Row: int64(i), Index: i})
	}
	for range 2 { // the second run has measured durations a simulation could use
		require.NoError(t, p.Run(context.Background(), chunks))
	}
	expectRows(t, rt.Arena(), x, out, n, rows)
	assert.Nil(t, p.sim)
	rs := p.LastRun()
	assert.Zero(t, rs.PredictedMakespan)
	assert.Zero(t, rs.PredictedBubble)
	assert.Positive(t, rs.Wall)
}
