package sched

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/loader/hosttest"
	"github.com/xpuhub/xpu/loader/plugintest"
)

// TestMain lets this test binary serve isolated plugins (see hosttest).
func TestMain(m *testing.M) { hosttest.Main(m) }

// twoStages is a two-stage program over n floats per row: stage 0 computes
// a = x+x (unit 1), b = -a (unit 0), y = b*x (unit 1); stage 1 computes z = relu(y) (unit 0),
// out = -z (unit 1). x is read at the chunk's row, out written at it; y crosses stages through
// a lane span, a and b cross units inside stage 0 through activation slots.
func twoStages(t *testing.T, rt *Runtime, n, rows int64, lanes int) (*Program, Span, Span) {
	t.Helper()
	return twoStagesOn(t, rt, n, rows, lanes, []int{1, 0, 1}, []int{0, 1})
}

// twoStagesOn is twoStages with the stages' node units given (s0's three nodes, s1's two).
func twoStagesOn(t *testing.T, rt *Runtime, n, rows int64, lanes int, units0, units1 []int) (*Program, Span, Span) {
	t.Helper()
	a := rt.Arena()
	x, err := a.Alloc(rows * n * 4)
	require.NoError(t, err)
	out, err := a.Alloc(rows * n * 4)
	require.NoError(t, err)
	var y []Span
	for range lanes {
		s, err := a.Alloc(n * 4)
		require.NoError(t, err)
		y = append(y, s)
	}
	g0 := core.NewGraph()
	xi := g0.Input("x", core.F32, n)
	g0.Output(g0.Named("y").Mul(g0.Named("b").Neg(g0.Named("a").Add(xi, xi)), xi))
	g1 := core.NewGraph()
	yi := g1.Input("y", core.F32, n)
	g1.Output(g1.Named("out").Neg(g1.Named("z").ReLU(yi)))
	require.NoError(t, g0.Err())
	require.NoError(t, g1.Err())
	p, err := rt.Compile(context.Background(), ProgramSpec{Name: "test", Phase: PhasePrefill, Lanes: lanes, Stages: []StageSpec{
		{Name: "s0", Layer: 0, Graph: g0, Units: units0,
			IO: []Binding{{Span: x, Stride: n * 4}, {Lanes: y}}},
		{Name: "s1", Layer: 1, Graph: g1, Units: units1,
			IO: []Binding{{Lanes: y}, {Span: out, Stride: n * 4}}},
	}})
	require.NoError(t, err)
	return p, x, out
}

func expectRows(t *testing.T, a *Arena, x, out Span, n, rows int64) {
	t.Helper()
	xs := core.DecodeF32(a.Bytes(x)[:rows*n*4])
	got := core.DecodeF32(a.Bytes(out)[:rows*n*4])
	for i, v := range xs {
		assert.Equal(t, -max(-2*v*v, 0), got[i], "value %d", i)
	}
}

func writeRows(a *Arena, x Span, n, rows int64) {
	xs := make([]float32, rows*n)
	for i := range xs {
		xs[i] = float32(i%9) - 4
	}
	copy(a.Bytes(x), core.EncodeF32(xs))
}

func refAndPlugin(t *testing.T, defines ...string) ([]core.Device, core.Backend) {
	t.Helper()
	path := plugintest.Plugin(t, defines...)
	pb, err := loader.Open(context.Background(), path, loader.Isolated(), loader.WithoutEnv())
	require.NoError(t, err)
	t.Cleanup(func() { pb.Close() })
	rb := ref.New()
	t.Cleanup(func() { rb.Close() })
	return append(rb.Devices(), pb.Devices()...), pb
}

// TestRuntimePipelinesChunks: chunks run through both stages on two units (the plugin in a
// child process, which sees the arena through an fd) with two lanes in flight, and every row
// comes out right; nothing is copied.
func TestRuntimePipelinesChunks(t *testing.T) {
	devs, pb := refAndPlugin(t)
	specs := []UnitSpec{{Backend: "ref"}, {Backend: pb.Info().Name}}
	tr := NewTrace()
	rt, err := NewRuntime(context.Background(), devs, specs, WithRuntimeTrace(tr))
	require.NoError(t, err)
	const n, rows = 64, 6
	p, x, out := twoStages(t, rt, n, rows, 2)
	writeRows(rt.Arena(), x, n, rows)
	var chunks []Chunk
	for i := range rows {
		chunks = append(chunks, Chunk{Row: int64(i), Index: i})
	}
	require.NoError(t, p.Run(context.Background(), chunks))
	expectRows(t, rt.Arena(), x, out, n, rows)
	rep := rt.Report()
	assert.Zero(t, rep.CopyBytes)
	assert.Equal(t, "fd", rep.Units[1].Import, "an isolated backend imports the arena by fd")
	assert.Equal(t, int64(5*rows), rep.Units[0].Tasks+rep.Units[1].Tasks, "5 partitions per chunk")
	assert.Contains(t, p.Placement(), "NEG")
	assert.Positive(t, tr.Len())
	require.NoError(t, rt.Close())
}

// TestRuntimeRowOutsideSpan: a chunk whose row puts a binding past its span fails the run
// instead of touching memory past it.
func TestRuntimeRowOutsideSpan(t *testing.T) {
	rb := ref.New()
	defer rb.Close()
	rt, err := NewRuntime(context.Background(), rb.Devices(), []UnitSpec{{Backend: "ref"}})
	require.NoError(t, err)
	defer rt.Close()
	g := core.NewGraph()
	g.Output(g.Neg(g.Input("x", core.F32, 4)))
	x, err := rt.Arena().Alloc(16)
	require.NoError(t, err)
	o, err := rt.Arena().Alloc(16)
	require.NoError(t, err)
	p, err := rt.Compile(context.Background(), ProgramSpec{Name: "p", Stages: []StageSpec{{Name: "s", Graph: g,
		Units: []int{0}, IO: []Binding{{Span: x, Stride: 16}, {Span: o}}}}})
	require.NoError(t, err)
	require.NoError(t, p.Run(context.Background(), []Chunk{{Row: 0}}))
	err = p.Run(context.Background(), []Chunk{{Row: 100}})
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "outside its span")

	small, err := rt.Arena().Alloc(8) // aligned up to 256 bytes: still too small below
	require.NoError(t, err)
	for _, b := range []Binding{{}, {Span: x, Stride: -4}, {Lanes: []Span{x, {}}}} {
		_, err = rt.Compile(context.Background(), ProgramSpec{Name: "bad", Stages: []StageSpec{{Name: "s", Graph: g,
			Units: []int{0}, IO: []Binding{b, {Span: o}}}}})
		require.ErrorIs(t, err, core.ErrInvalidArgument, "%+v", b)
	}
	big := core.NewGraph()
	big.Output(big.Neg(big.Input("x", core.F32, 128)))
	_, err = rt.Compile(context.Background(), ProgramSpec{Name: "bad", Stages: []StageSpec{{Name: "s", Graph: big,
		Units: []int{0}, IO: []Binding{{Span: small}, {Span: o}}}}})
	require.ErrorIs(t, err, core.ErrInvalidArgument)
}

// TestRuntimeCrashedUnit: a unit whose backend crashes mid-run fails the request with
// core.ErrBackendCrashed, later runs fail fast, Close leaves no goroutine, and a runtime rebuilt
// on the restarted backend works.
func TestRuntimeCrashedUnit(t *testing.T) {
	devs, pb := refAndPlugin(t, "TP_FAULT=1")
	before := runtime.NumGoroutine()
	specs := []UnitSpec{{Backend: "ref"}, {Backend: pb.Info().Name}}
	rt, err := NewRuntime(context.Background(), devs, specs)
	require.NoError(t, err)
	const n, rows = 16, 3
	p, x, _ := twoStages(t, rt, n, rows, 2)
	writeRows(rt.Arena(), x, n, rows)
	err = p.Run(context.Background(), []Chunk{{Row: 0}, {Row: 1, Index: 1}})
	require.ErrorIs(t, err, core.ErrBackendCrashed)
	assert.Contains(t, err.Error(), "s0/p0", "the error names the partition")
	err = p.Run(context.Background(), []Chunk{{Row: 2}})
	require.ErrorIs(t, err, core.ErrBackendCrashed)
	assert.Contains(t, err.Error(), "rebuild")
	require.NoError(t, rt.Close())
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), before, "goroutines left behind")

	require.NoError(t, pb.(loader.Restarter).Restart(context.Background()))
	rt, err = NewRuntime(context.Background(), devs, specs)
	require.NoError(t, err)
	defer rt.Close()
	p, x, _ = twoStages(t, rt, n, rows, 1)
	writeRows(rt.Arena(), x, n, rows)
	// the fault is built into the plugin: the rebuilt runtime reaches it again, cleanly
	require.ErrorIs(t, p.Run(context.Background(), []Chunk{{Row: 0}}), core.ErrBackendCrashed)
}

// TestRuntimeRefusalNamesNodeAndUnit: a node its unit refuses fails Compile, naming both and
// the unit's reason; with a fallback it moves.
func TestRuntimeRefusalNamesNodeAndUnit(t *testing.T) {
	devs, pb := refAndPlugin(t)
	specs := []UnitSpec{{Backend: "ref"}, {Backend: pb.Info().Name}}
	rt, err := NewRuntime(context.Background(), devs, specs)
	require.NoError(t, err)
	defer rt.Close()
	g := core.NewGraph()
	xi := g.Input("x", core.F32, 4)
	g.Output(g.Named("gelu").GELU(g.Named("neg").Neg(xi))) // the test plugin has no GELU
	require.NoError(t, g.Err())
	x, _ := rt.Arena().Alloc(16)
	o, _ := rt.Arena().Alloc(16)
	spec := StageSpec{Name: "s", Graph: g, Units: []int{1, 1}, IO: []Binding{{Span: x}, {Span: o}}}
	_, err = rt.Compile(context.Background(), ProgramSpec{Name: "p", Stages: []StageSpec{spec}})
	require.ErrorIs(t, err, ErrPlanRefused)
	require.ErrorIs(t, err, core.ErrUnsupported)
	assert.Contains(t, err.Error(), "gelu")
	assert.Contains(t, err.Error(), specs[1].String())

	spec.Fallback = []int{-1, 0}
	p, err := rt.Compile(context.Background(), ProgramSpec{Name: "p", Stages: []StageSpec{spec}})
	require.NoError(t, err)
	assert.Equal(t, []int{1, 1}, p.UnitNodes())
}

func TestArena(t *testing.T) {
	a := NewArena()
	s1, err := a.Alloc(10)
	require.NoError(t, err)
	s2, err := a.Alloc(arenaBlockMin * 2)
	require.NoError(t, err)
	assert.Equal(t, int64(arenaAlign), s1.Size, "spans are aligned")
	assert.Len(t, a.Bytes(s2), arenaBlockMin*2)
	a.Bytes(s1)[0] = 7
	assert.Equal(t, byte(7), a.Bytes(s1)[0])
	_, err = a.Alloc(0)
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	require.NoError(t, a.Close())
	_, err = a.Alloc(8)
	require.ErrorIs(t, err, core.ErrBadState)
	require.NoError(t, a.Close())
}
