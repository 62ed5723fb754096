package ref

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// i8s encodes int8 codes.
func i8s(vs ...int8) []byte {
	b := make([]byte, len(vs))
	for i, v := range vs {
		b[i] = byte(v)
	}
	return b
}

func TestMatMulW8A8(t *testing.T) {
	// a = [[1 -2 3] [127 -127 0]], b = [[4 5 -6] [-1 0 2]]: acc = [[-24 5] [-127 -127]].
	qa := func(g *core.Graph) *core.Tensor {
		return g.Const("a", core.I8, core.Shape{2, 3}, i8s(1, -2, 3, 127, -127, 0))
	}
	qb := func(g *core.Graph) *core.Tensor {
		return g.Const("b", core.I8, core.Shape{2, 3}, i8s(4, 5, -6, -1, 0, 2))
	}
	w8 := func(o core.W8A8Options) func(g *core.Graph) *core.Tensor {
		return func(g *core.Graph) *core.Tensor {
			if o.BScales == nil && o.BScale == 0 {
				o.BScales = c32(g, core.Shape{2}, 0.5, 2)
			}
			return g.MatMulW8A8(qa(g), qb(g), o)
		}
	}
	runCases(t, []opCase{
		{name: "per-tensor", build: w8(core.W8A8Options{AScale: 0.5, BScale: 0.25}),
			shape: core.Shape{2, 2}, want: []float32{-3, 0.625, -15.875, -15.875}},
		{name: "per-channel", build: w8(core.W8A8Options{AScale: 1}),
			want: []float32{-12, 10, -63.5, -254}},
		{name: "grid", build: w8(core.W8A8Options{AScale: 0.5, BScale: 0.25, OutScale: 0.3}),
			want: []float32{-3, 0.6, -15.9, -15.9}},
		{name: "grid ties round half away", build: w8(core.W8A8Options{AScale: 1, BScale: 1, OutScale: 2}),
			want: []float32{-24, 6, -128, -128}},
		{name: "grid clamps to 32767 steps", build: w8(core.W8A8Options{AScale: 0.5, BScale: 0.25, OutScale: 1e-4}),
			want: []float32{-3, 0.625, -3.2767, -3.2767}},
		{name: "f16 out", build: w8(core.W8A8Options{AScale: 0.5, BScale: 0.25, Out: core.F16}),
			want: []float32{-3, 0.625, -15.875, -15.875}},
		{name: "rank-1 a", build: func(g *core.Graph) *core.Tensor {
			a := g.Const("a", core.I8, core.Shape{3}, i8s(1, -2, 3))
			return g.MatMulW8A8(a, qb(g), core.W8A8Options{AScale: 0.5, BScale: 0.25})
		}, shape: core.Shape{2}, want: []float32{-3, 0.625}},
		{name: "batched a", build: func(g *core.Graph) *core.Tensor {
			a := g.Const("a", core.I8, core.Shape{2, 1, 3}, i8s(1, -2, 3, 127, -127, 0))
			return g.MatMulW8A8(a, qb(g), core.W8A8Options{AScale: 0.5, BScale: 0.25})
		}, shape: core.Shape{2, 1, 2}, want: []float32{-3, 0.625, -15.875, -15.875}},
		{name: "K = 0", build: func(g *core.Graph) *core.Tensor {
			a := g.Const("a", core.I8, core.Shape{2, 0}, nil)
			b := g.Const("b", core.I8, core.Shape{3, 0}, nil)
			return g.MatMulW8A8(a, b, core.W8A8Options{AScale: 1, BScale: 1})
		}, want: []float32{0, 0, 0, 0, 0, 0}},
		{name: "float a, per-channel i8 b", build: func(g *core.Graph) *core.Tensor {
			return g.MatMulW8A8(c32(g, core.Shape{1, 3}, 0.5, 1, -1), qb(g), core.W8A8Options{BScales: c32(g, core.Shape{2}, 0.5, 2)})
		}, want: []float32{6.5, -5}},
	})
}

func TestMatMulW8A8BadScaleInput(t *testing.T) {
	g := core.NewGraph()
	s := g.Input("s", core.F32, 2)
	g.Output(g.MatMulW8A8(g.Input("a", core.I8, 1, 4), g.Input("b", core.I8, 2, 4), core.W8A8Options{AScale: 1, BScales: s}))
	require.NoError(t, g.Err())
	for _, bad := range []float32{0, -1, float32(math.NaN()), float32(math.Inf(1))} {
		_, err := Run(context.Background(), g, [][]byte{make([]byte, 4), make([]byte, 8), core.EncodeF32([]float32{1, bad})})
		assert.ErrorIs(t, err, core.ErrInvalidArgument, "scale %g", bad)
	}
}

func TestShadowMatMul(t *testing.T) {
	x := func(g *core.Graph) *core.Tensor { return c32(g, core.Shape{2, 4}, 0.5, 3, -4, 1, 2, -2, 2.5, -10) }
	runCases(t, []opCase{
		{name: "all channels", build: func(g *core.Graph) *core.Tensor {
			return g.ShadowMatMul(x(g), c32(g, core.Shape{4, 2}, 1, 2, 3, 4, 5, 6, 7, 8), nil, 2)
		}, shape: core.Shape{2, 2}, want: []float32{-7, -8, -53.5, -61}},
		{name: "ids subset with duplicates", build: func(g *core.Graph) *core.Tensor {
			return g.ShadowMatMul(x(g), c32(g, core.Shape{3, 2}, 1, 1, 2, 0, 10, 10), ci32(g, core.Shape{3}, 2, 2, 0), 2)
		}, want: []float32{-6, -2, 1.5, 0.5}},
		{name: "no outliers", build: func(g *core.Graph) *core.Tensor {
			return g.ShadowMatMul(x(g), c32(g, core.Shape{4, 2}, 1, 2, 3, 4, 5, 6, 7, 8), nil, 10)
		}, want: []float32{0, 0, 0, 0}},
		{name: "rank 1, f16", build: func(g *core.Graph) *core.Tensor {
			return g.ShadowMatMul(c16(g, core.Shape{3}, -3, 0, 1.5), c16(g, core.Shape{3, 1}, 2, 7, 4), nil, 1)
		}, shape: core.Shape{1}, want: []float32{-2}},
		{name: "NaN propagates", build: func(g *core.Graph) *core.Tensor {
			return g.ShadowMatMul(c32(g, core.Shape{1, 2}, nan, 0), c32(g, core.Shape{2, 1}, 1, 1), nil, 1)
		}, want: []float32{nan}},
	})
}

func TestShadowMatMulIDOutOfRange(t *testing.T) {
	g := core.NewGraph()
	g.Output(g.ShadowMatMul(g.Input("x", core.F32, 1, 4), g.Input("wt", core.F32, 2, 3), g.Input("ids", core.I32, 2), 1))
	require.NoError(t, g.Err())
	for _, id := range []int32{-1, 4} {
		_, err := Run(context.Background(), g, [][]byte{make([]byte, 16), make([]byte, 24), core.EncodeI32([]int32{0, id})})
		assert.ErrorIs(t, err, core.ErrInvalidArgument, "id %d", id)
	}
}
