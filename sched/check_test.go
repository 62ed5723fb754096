package sched

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

func TestFirstNonFinite(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, c := range []struct {
		xs   []float32
		want int
	}{
		{nil, -1},
		{[]float32{0, -0.0, math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32}, -1},
		{[]float32{1, nan}, 1},
		{[]float32{inf, 1}, 0},
		{[]float32{1, 2, -inf}, 2},
	} {
		assert.Equal(t, c.want, FirstNonFinite(c.xs), "%v", c.xs)
	}
}

func TestFiniteCheckNames(t *testing.T) {
	g := core.NewGraph()
	x := g.Input("x", core.F32, 2, 3)
	mid := g.Named("mid").Neg(x)
	g.Output(g.Named("a").Neg(mid), g.Named("b").ReLU(mid))
	require.NoError(t, g.Err())
	named := FiniteCheck{Graphs: []*core.Graph{g}, Stage: func(s int) string { return "the stage" },
		Output: func(_ *core.Graph, i int) string { return [...]string{"first", "second"}[i] }}
	nan := float32(math.NaN())
	f16 := make([]byte, 2*6)
	binary.LittleEndian.PutUint16(f16[8:], core.F32ToF16(float32(math.Inf(-1))))
	for _, c := range []struct {
		name  string
		check FiniteCheck
		t     *core.Tensor
		data  []byte
		want  string // "" for no error
	}{
		{"finite", named, g.Outputs[0], core.EncodeF32([]float32{1, 2, 3, 4, 5, 6}), ""},
		{"named output", named, g.Outputs[1], core.EncodeF32([]float32{1, 2, 3, 4, nan, 6}),
			"the stage: output second (b [2,3]): element 4 (chunk row 1) is NaN"},
		{"default names", FiniteCheck{Graphs: []*core.Graph{g}}, g.Outputs[0], core.EncodeF32([]float32{nan, 2, 3, 4, 5, 6}),
			"stage 0: output 0 (a [2,3]): element 0 (chunk row 0) is NaN"},
		{"intermediate", named, mid, core.EncodeF32([]float32{1, nan, 3, 4, 5, 6}), "output intermediate (mid"},
		{"no graphs", FiniteCheck{}, g.Outputs[0], core.EncodeF32([]float32{1, nan, 3, 4, 5, 6}), "output intermediate (a"},
		{"f16", named, withDType(g.Outputs[0], core.F16), f16, "element 4 (chunk row 1) is -Inf"},
		{"i32 unchecked", named, withDType(g.Outputs[0], core.I32), make([]byte, 24), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.check.Check(0, c.t, c.data)
			if c.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrNonFinite)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	err := named.Check(0, g.Outputs[0], []byte{1, 2, 3})
	require.Error(t, err, "bytes that are no whole F32")
	assert.NotErrorIs(t, err, ErrNonFinite)
}

// withDType is a copy of t in dtype dt.
func withDType(t *core.Tensor, dt core.DType) *core.Tensor {
	c := *t
	c.DType = dt
	return &c
}

// TestFiniteCheckFailsTheRun: as a program's Check, it fails the run that computes an infinity
// in its second stage, naming that stage, and passes a run that computes none.
func TestFiniteCheckFailsTheRun(t *testing.T) {
	rb := ref.New()
	defer rb.Close()
	rt, err := NewRuntime(context.Background(), rb.Devices(), []UnitSpec{{Backend: "ref"}})
	require.NoError(t, err)
	defer rt.Close()
	a := rt.Arena()
	spans := make([]Span, 3)
	for i := range spans {
		spans[i], err = a.Alloc(16)
		require.NoError(t, err)
	}
	g0 := core.NewGraph()
	g0.Output(g0.Named("y").Neg(g0.Input("x", core.F32, 4)))
	g1 := core.NewGraph()
	y := g1.Input("y", core.F32, 4)
	g1.Output(g1.Named("z").Mul(y, y)) // overflows to +Inf for |y| > 2^64
	check := FiniteCheck{Graphs: []*core.Graph{g0, g1}}
	p, err := rt.Compile(context.Background(), ProgramSpec{Name: "p", Check: check.Check, Stages: []StageSpec{
		{Name: "s0", Graph: g0, Units: []int{0}, IO: []Binding{{Span: spans[0]}, {Span: spans[1]}}},
		{Name: "s1", Graph: g1, Units: []int{0}, IO: []Binding{{Span: spans[1]}, {Span: spans[2]}}},
	}})
	require.NoError(t, err)
	copy(a.Bytes(spans[0]), core.EncodeF32([]float32{1, 2, 3, 4}))
	require.NoError(t, p.Run(context.Background(), []Chunk{{}}))
	copy(a.Bytes(spans[0]), core.EncodeF32([]float32{1, 1e30, 3, 4}))
	err = p.Run(context.Background(), []Chunk{{}})
	require.ErrorIs(t, err, ErrNonFinite)
	assert.Contains(t, err.Error(), "stage 1: output 0 (z [4]): element 1")
}
