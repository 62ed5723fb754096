package coresel_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched/cputopo"
)

// phaseRig is one neon context with one small GEMV graph prepared twice, once per phase, with
// each phase's cpus=/threads= from cputopo.NeonPhaseOptions: what the runner's per-phase switch
// does, without the runner.
type phaseRig struct {
	ctx     core.Context
	closers []interface{ Close() error }
	prefill core.Execution
	decode  core.Execution
	out     [2]core.Buffer
}

func newPhaseRig(tb testing.TB, prefill, decode cputopo.Selection) *phaseRig {
	tb.Helper()
	ctx := context.Background()
	b, err := loader.Open(ctx, "neon")
	if errors.Is(err, core.ErrNotFound) {
		required.Skip(tb, "neon", "neon plugin not built or cannot run here (run make): %v", err)
	}
	require.NoError(tb, err)
	tb.Cleanup(func() { b.Close() })
	top, err := cputopo.Read()
	if err != nil {
		tb.Skipf("no CPU topology here: %v", err)
	}
	if top.Counts().Cores() < max(prefill.Cores(), decode.Cores()) || len(top.Clusters) != len(prefill) {
		tb.Skipf("this machine (%s) cannot hold selections %s and %s", top, prefill.Key(), decode.Key())
	}
	po, err := cputopo.NeonPhaseOptions(top, prefill, decode)
	require.NoError(tb, err)
	c, err := b.Devices()[0].NewContext(ctx, po.Context)
	require.NoError(tb, err)
	r := &phaseRig{ctx: c}
	tb.Cleanup(func() {
		for _, x := range slices.Backward(r.closers) {
			require.NoError(tb, x.Close())
		}
		require.NoError(tb, c.Close())
	})
	const k, n = 256, 256
	w := make([]byte, k*n*4)
	for i := range k * n {
		binary.LittleEndian.PutUint32(w[4*i:], math.Float32bits(float32(i%7)*0.01))
	}
	g := core.NewGraph()
	x := g.Input("x", core.F32, 1, k)
	g.Output(g.MatMul(x, g.Const("w", core.F32, core.Shape{k, n}, w)))
	require.NoError(tb, g.Err())
	in, err := c.Alloc(k*4, core.BufferDevice)
	require.NoError(tb, err)
	r.closers = append(r.closers, in)
	xs := make([]byte, k*4)
	for i := range k {
		binary.LittleEndian.PutUint32(xs[4*i:], math.Float32bits(float32(i%5)))
	}
	require.NoError(tb, in.Write(0, xs))
	for i, opts := range []map[string]string{po.Prefill, po.Decode} {
		var popts []core.PrepareOption
		for key, v := range opts {
			popts = append(popts, core.WithPrepareOption(key, v))
		}
		exe, err := c.Prepare(ctx, g, popts...)
		require.NoError(tb, err)
		r.closers = append(r.closers, exe)
		e, err := exe.NewExecution()
		require.NoError(tb, err)
		r.closers = append(r.closers, e)
		out, err := c.Alloc(n*4, core.BufferDevice)
		require.NoError(tb, err)
		r.closers = append(r.closers, out)
		require.NoError(tb, e.Bind(0, in, 0))
		require.NoError(tb, e.Bind(1, out, 0))
		r.out[i] = out
		if i == 0 {
			r.prefill = e
		} else {
			r.decode = e
		}
	}
	return r
}

// TestPhaseSwitchSameResult: the two phases' executables, alternating on one context (so the
// pool re-pins at every switch), compute the same bytes.
func TestPhaseSwitchSameResult(t *testing.T) {
	r := newPhaseRig(t, cputopo.Selection{2}, cputopo.Selection{1})
	ctx := context.Background()
	a, b := make([]byte, 256*4), make([]byte, 256*4)
	for range 5 {
		require.NoError(t, r.prefill.Run(ctx))
		require.NoError(t, r.decode.Run(ctx))
		require.NoError(t, r.out[0].Read(0, a))
		require.NoError(t, r.out[1].Read(0, b))
		require.Equal(t, a, b)
	}
}

// BenchmarkPhaseSwitch measures what switching from the prefill selection (every core) to the
// decode selection (one core) costs on a neon context: rounds alternate P,D,P,D (a switch
// before every run) with P,P,D,D (a switch every second run) over the same work; the
// difference of their medians, halved, is one switch. Reported as µs/switch.
func BenchmarkPhaseSwitch(b *testing.B) {
	r := newPhaseRig(b, cputopo.Selection{2}, cputopo.Selection{1})
	ctx := context.Background()
	run := func(order []core.Execution, reps int) time.Duration {
		t0 := time.Now()
		for range reps {
			for _, e := range order {
				if err := e.Run(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		return time.Since(t0) / time.Duration(reps)
	}
	alt := []core.Execution{r.prefill, r.decode, r.prefill, r.decode}
	grouped := []core.Execution{r.prefill, r.prefill, r.decode, r.decode}
	run(alt, 50) // warm-up: pages, pool threads
	var da, dg []time.Duration
	for b.Loop() {
		da = append(da, run(alt, 20))
		dg = append(dg, run(grouped, 20))
	}
	slices.Sort(da)
	slices.Sort(dg)
	ma, mg := da[len(da)/2], dg[len(dg)/2]
	// ABAB has 4 switches per 4 runs, AABB has 2
	b.ReportMetric(float64(ma-mg)/2/1e3, "µs/switch")
	b.ReportMetric(float64(ma)/4/1e3, "µs/run-alternating")
	b.ReportMetric(float64(mg)/4/1e3, "µs/run-grouped")
}
