package sched

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

// TestRuntimeAddUnitAndRebind: a runtime grows a unit while it has a program, a program on the
// new unit runs, and rebinding a program's input and output moves where the next run reads and
// writes (bad rebinds are refused, and a closed runtime takes no unit).
func TestRuntimeAddUnitAndRebind(t *testing.T) {
	ctx := context.Background()
	rb := ref.New()
	defer rb.Close()
	dev := rb.Devices()[0]
	rt, err := NewRuntime(ctx, rb.Devices(), []UnitSpec{{Backend: "ref"}}, WithProcHeadroom(false))
	require.NoError(t, err)
	g := core.NewGraph()
	g.Output(g.Named("neg").Neg(g.Input("x", core.F32, 4)))
	require.NoError(t, g.Err())
	a := rt.Arena()
	span := func() Span {
		s, err := a.Alloc(16)
		require.NoError(t, err)
		return s
	}
	x0, o0, x1, o1 := span(), span(), span(), span()
	p0, err := rt.Compile(ctx, ProgramSpec{Name: "p0", Stages: []StageSpec{{Name: "s", Graph: g, Units: []int{0},
		IO: []Binding{{Span: x0}, {Span: o0}}}}})
	require.NoError(t, err)

	u, err := OpenUnit(ctx, dev, UnitSpec{Backend: "ref", Options: map[string]string{"threads": "1"}})
	require.NoError(t, err)
	idx, err := rt.addUnit(u)
	require.NoError(t, err)
	assert.Equal(t, 1, idx)
	assert.Len(t, rt.Units(), 2)
	p1, err := rt.Compile(ctx, ProgramSpec{Name: "p1", Stages: []StageSpec{{Name: "s", Graph: g, Units: []int{1},
		IO: []Binding{{Span: x0}, {Span: o0}}}}})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, p1.UnitNodes())

	copy(a.Bytes(x0), core.EncodeF32([]float32{1, 2, 3, 4}))
	copy(a.Bytes(x1), core.EncodeF32([]float32{5, 6, 7, 8}))
	for _, p := range []*Program{p0, p1} {
		require.NoError(t, p.Run(ctx, []Chunk{{}}))
		assert.Equal(t, []float32{-1, -2, -3, -4}, core.DecodeF32(a.Bytes(o0)[:16]), p.Name())
		require.NoError(t, p.rebind(0, 0, Binding{Span: x1}))
		require.NoError(t, p.rebind(0, 1, Binding{Span: o1}))
		require.NoError(t, p.Run(ctx, []Chunk{{}}))
		assert.Equal(t, []float32{-5, -6, -7, -8}, core.DecodeF32(a.Bytes(o1)[:16]), p.Name())
		require.NoError(t, p.rebind(0, 0, Binding{Span: x0}))
		require.NoError(t, p.rebind(0, 1, Binding{Span: o0}))
		clear(a.Bytes(o1))
	}
	for _, bad := range []struct {
		stage, io int
		b         Binding
	}{{1, 0, Binding{Span: x1}}, {0, 2, Binding{Span: x1}}, {0, 0, Binding{}}, {0, 0, Binding{Span: x1, Stride: -1}}} {
		assert.ErrorIs(t, p0.rebind(bad.stage, bad.io, bad.b), core.ErrInvalidArgument, "%+v", bad)
	}
	require.NoError(t, p0.Close())
	assert.ErrorIs(t, p0.rebind(0, 0, Binding{Span: x1}), core.ErrBadState, "a closed program")
	require.NoError(t, rt.Close())

	late, err := OpenUnit(ctx, dev, UnitSpec{Backend: "ref"})
	require.NoError(t, err)
	_, err = rt.addUnit(late)
	assert.ErrorIs(t, err, core.ErrBadState)
	require.NoError(t, late.Close())
}
