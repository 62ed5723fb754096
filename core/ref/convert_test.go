package ref

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

func TestConversions(t *testing.T) {
	table := []float32{1, 2, 3, 4, 5, 6}
	q8 := append(q8Row(2, -4), q8Row(1)...) // rows [1, -2, 0...] and [0.5, 0...]
	q4 := make([]byte, 18)                  // d = -2, codes: 0 at 0 (+16), 15 at 16 (-14), rest 8
	q4[0], q4[1] = 0x00, 0xc0
	for j := 2; j < 18; j++ {
		q4[j] = 0x88
	}
	q4[2] = 0xf0
	q4want := make([]float32, 32)
	q4want[0], q4want[16] = 16, -14
	q8r0, q8r1 := make([]float32, 32), make([]float32, 32)
	q8r0[0], q8r0[1], q8r1[0] = 1, -2, 0.5
	quantIn := make([]float32, 32)
	copy(quantIn, []float32{0.5, -0.5, 1.4, -2.5, 127, -126.6, 2.5, -1.49})

	runCases(t, []opCase{
		{name: "get_rows f32", shape: core.Shape{3, 2}, build: func(g *core.Graph) *core.Tensor {
			return g.GetRows(c32(g, core.Shape{3, 2}, table...), ci32(g, core.Shape{3}, 2, 0, 2))
		}, wantBytes: core.EncodeF32([]float32{5, 6, 1, 2, 5, 6})},
		{name: "get_rows 2-d ids", shape: core.Shape{2, 2, 2}, build: func(g *core.Graph) *core.Tensor {
			return g.GetRows(c32(g, core.Shape{3, 2}, table...), ci32(g, core.Shape{2, 2}, 1, 1, 0, 2))
		}, wantBytes: core.EncodeF32([]float32{3, 4, 3, 4, 1, 2, 5, 6})},
		{name: "get_rows f16", build: func(g *core.Graph) *core.Tensor {
			return g.GetRows(c16(g, core.Shape{3, 2}, table...), ci32(g, core.Shape{1}, 1))
		}, wantBytes: core.EncodeF32([]float32{3, 4})},
		{name: "get_rows bf16", build: func(g *core.Graph) *core.Tensor {
			bf := []byte{0x80, 0x3f, 0x00, 0x40, 0x40, 0x40, 0x80, 0x40} // 1, 2, 3, 4
			return g.GetRows(g.Const("bf", core.BF16, core.Shape{2, 2}, bf), ci32(g, core.Shape{1}, 1))
		}, want: []float32{3, 4}},
		{name: "get_rows i8", build: func(g *core.Graph) *core.Tensor {
			tb := g.Const("i8", core.I8, core.Shape{2, 2}, []byte{1, 2, 0xfd, 4})
			return g.GetRowsI8(tb, ci32(g, core.Shape{1}, 1), 0.5)
		}, want: []float32{-1.5, 2}},
		{name: "get_rows q8_0", build: func(g *core.Graph) *core.Tensor {
			return g.GetRows(g.Const("q8", core.Q8_0, core.Shape{2, 32}, q8), ci32(g, core.Shape{2}, 1, 0))
		}, want: append(append([]float32(nil), q8r1...), q8r0...)},
		{name: "get_rows q4_0", build: func(g *core.Graph) *core.Tensor {
			return g.GetRows(g.Const("q4", core.Q4_0, core.Shape{1, 32}, q4), ci32(g, core.Shape{1}, 0))
		}, want: q4want},
		{name: "get_rows no ids", shape: core.Shape{0, 2}, build: func(g *core.Graph) *core.Tensor {
			return g.GetRows(c32(g, core.Shape{3, 2}, table...), ci32(g, core.Shape{0}))
		}, want: []float32{}},
		{name: "cast f32 to f16 rounds to nearest even", build: func(g *core.Graph) *core.Tensor {
			x := c32(g, core.Shape{6}, 1, 1.00048828125, 1.00146484375, 65520, nan, -5.960464477539063e-08)
			return g.Cast(x, core.F16)
		}, wantBytes: u16s(0x3c00, 0x3c00, 0x3c02, 0x7c00, 0x7e00, 0x8001)},
		{name: "cast f16 to f32 exact", build: func(g *core.Graph) *core.Tensor {
			return g.Cast(g.Const("h", core.F16, core.Shape{2}, u16s(0x3c01, 0x0001)), core.F32)
		}, wantBytes: core.EncodeF32([]float32{1.0009765625, 5.960464477539063e-08})},
		{name: "cast f32 to bf16", build: func(g *core.Graph) *core.Tensor {
			return g.Cast(c32(g, core.Shape{2}, 3.14159, -1), core.BF16)
		}, wantBytes: u16s(0x4049, 0xbf80)},
		{name: "cast bf16 to f16", build: func(g *core.Graph) *core.Tensor {
			return g.Cast(g.Const("bf", core.BF16, core.Shape{1}, u16s(0x4049)), core.F16) // 3.140625
		}, wantBytes: u16s(0x4248)},
		{name: "cast i32 to f32 and f16", build: func(g *core.Graph) *core.Tensor {
			x := ci32(g, core.Shape{3}, -3, 16777217, 2049)
			return g.Concat(0, g.Cast(x, core.F32), g.Cast(g.Cast(x, core.F16), core.F32))
		}, wantBytes: core.EncodeF32([]float32{-3, 16777216, 2049, -3, float32(math.Inf(1)), 2048})},
		{name: "quantize q8_0", build: func(g *core.Graph) *core.Tensor {
			return g.Quantize(c32(g, core.Shape{1, 32}, quantIn...), core.Q8_0, 0)
		}, wantBytes: append([]byte{0x00, 0x3c, 1, 0xff, 1, 0xfd, 127, 0x81, 3, 0xff}, make([]byte, 24)...)},
		{name: "quantize q4_0", build: func(g *core.Graph) *core.Tensor {
			xs := make([]float32, 32)
			xs[0], xs[1], xs[16] = -8, 7, 0.5 // d = 1: codes 0, 15, 9
			return g.Quantize(c32(g, core.Shape{32}, xs...), core.Q4_0, 0)
		}, wantBytes: append([]byte{0x00, 0x3c, 0x90, 0x8f}, []byte{0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88}...)},
		{name: "quantize i8", build: func(g *core.Graph) *core.Tensor {
			return g.Quantize(c32(g, core.Shape{4}, 1, -0.75, 100, 0.2), core.I8, 0.5)
		}, wantBytes: []byte{2, 0xfe, 127, 0}},
		{name: "dequantize q8_0", build: func(g *core.Graph) *core.Tensor {
			return g.Dequantize(g.Const("q8", core.Q8_0, core.Shape{2, 32}, q8), 0)
		}, want: append(append([]float32(nil), q8r0...), q8r1...)},
		{name: "dequantize q4_0", build: func(g *core.Graph) *core.Tensor {
			return g.Dequantize(g.Const("q4", core.Q4_0, core.Shape{32}, q4), 0)
		}, want: q4want},
		{name: "dequantize i8", build: func(g *core.Graph) *core.Tensor {
			return g.Dequantize(g.Const("i8", core.I8, core.Shape{3}, []byte{4, 0x81, 0}), 0.25)
		}, want: []float32{1, -31.75, 0}},
	})
}

func TestGetRowsOutOfRange(t *testing.T) {
	for _, id := range []int32{3, -1} {
		g := core.NewGraph()
		ids := g.Input("ids", core.I32, 2)
		g.Output(g.Named("embed").GetRows(c32(g, core.Shape{3, 2}, 1, 2, 3, 4, 5, 6), ids))
		require.NoError(t, g.Err())
		_, err := Run(context.Background(), g, [][]byte{core.EncodeI32([]int32{0, id})})
		require.Error(t, err, "id %d", id)
		assert.True(t, errors.Is(err, core.ErrInvalidArgument), "%v", err)
		assert.Contains(t, err.Error(), `"embed"`)
	}
}
