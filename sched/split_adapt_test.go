package sched

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// TestCutBalancer: the picked cut moves towards the share that equalises the two sides'
// times, stays put when they are equal, and stops at the outermost cut point.
func TestCutBalancer(t *testing.T) {
	cases := []struct {
		name   string
		t0, t1 time.Duration // per pick, at whatever cut is current: side 0 runs share/speed0
		speed  [2]float64    // rows per unit time of each side
		want   float64       // the share picked after 40 picks
	}{
		{"equal speeds stay at the ratio", 0, 0, [2]float64{1, 1}, 0.5},
		{"side 1 10% slower", 0, 0, [2]float64{1, 0.9}, 0.525},
		{"side 0 10% slower", 0, 0, [2]float64{0.9, 1}, 0.475},
		{"side 0 twice as fast: the outermost point", 0, 0, [2]float64{2, 1}, 0.6},
		{"side 1 twice as fast", 0, 0, [2]float64{1, 2}, 0.4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newCutBalancer(0.5)
			require.Equal(t, 0.5, b.shares[b.cur], "starts at the ratio")
			for range 40 {
				s := b.shares[b.cur]
				b.observe(0, time.Duration(1e6*s/c.speed[0]))
				b.observe(1, time.Duration(1e6*(1-s)/c.speed[1]))
				b.pick()
			}
			assert.InDelta(t, c.want, b.shares[b.cur], 1e-9)
		})
	}
	// a request in which one side ran nothing (an error, a cancelled run) leaves the estimate
	b := newCutBalancer(0.5)
	b.observe(0, time.Millisecond)
	b.pick()
	assert.Equal(t, 0.5, b.est)
}

// TestSplitAdaptiveCuts: an adaptive split gives the unsplit result at every cut point, bit
// for bit on the reference, for F32 and Q4_0 weights, and each request runs the cut the
// balancer picked.
func TestSplitAdaptiveCuts(t *testing.T) {
	rt := twoRefUnits(t)
	const k, n = 64, 1024 // cut points 2.5% apart are 25 rows: rowAlign rounds some together
	for _, dt := range []core.DType{core.F32, core.Q4_0} {
		g := splitGraph(t, 1, k, n, dt)
		wantY, wantZ, p0 := runSplit(t, rt, g, nil)
		sp := &NodeSplit{Strategy: SplitRows, Units: []int{0, 1}, Ratio: []float64{0.5, 0.5}, Merge: 0, Adapt: true}
		_, _, p := runSplit(t, rt, g, sp)
		require.NotNil(t, p.cuts)
		a := rt.Arena()
		for i, s := range p.cuts.shares {
			t.Run(fmt.Sprintf("%s/share=%.3f", dt, s), func(t *testing.T) {
				p.cuts.est = s
				p.cuts.busy[0].Store(0) // no measurement: the pick is the estimate's point
				p.cuts.busy[1].Store(0)
				y, z := outputsOf(p)
				clear(a.Bytes(y))
				clear(a.Bytes(z))
				require.NoError(t, p.Run(context.Background(), []Chunk{{}}))
				require.Equal(t, i, p.cuts.cur)
				assert.Equal(t, s, p.LastRun().Cut, "the request's stats give its cut")
				assert.Equal(t, wantY, core.DecodeF32(a.Bytes(y)[:n*4]))
				assert.Equal(t, wantZ, core.DecodeF32(a.Bytes(z)[:n*4]))
			})
		}
		// the phase's stats count the requests at each cut: one each, and the first run's
		// (the middle point) once more
		var cuts []CutRuns
		for _, ps := range rt.Report().Phases {
			if ps.Phase == PhasePrefill {
				cuts = ps.Cuts
				assert.Contains(t, ps.String(), "adaptive cut (first unit's share × runs) 0.400×")
			}
		}
		require.Len(t, cuts, len(p.cuts.shares))
		for i, c := range cuts {
			assert.Equal(t, p.cuts.shares[i], c.Share)
			want := int64(1)
			if c.Share == 0.5 {
				want = 2
			}
			if dt == core.Q4_0 { // the F32 program's requests count in the same phase
				want *= 2
			}
			assert.Equal(t, want, c.Runs, "share %.3f", c.Share)
		}
		require.NoError(t, p.Close())
		require.NoError(t, p0.Close())
	}
}

// outputsOf are the spans runSplit bound to y and z.
func outputsOf(p *Program) (Span, Span) {
	io := p.stages[0].spec.IO
	return io[1].Span, io[2].Span
}
