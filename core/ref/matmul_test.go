package ref

import (
	"testing"

	"github.com/xpuhub/xpu/core"
)

// q8Row is one Q8_0 block with d = 0.5 and the given leading codes (the rest 0).
func q8Row(codes ...int8) []byte {
	b := make([]byte, 34)
	b[0], b[1] = 0x00, 0x38
	for i, c := range codes {
		b[2+i] = byte(c)
	}
	return b
}

func ones(n int) []float32 {
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = 1
	}
	return xs
}

func TestMatMul(t *testing.T) {
	b23 := []float32{1, 0, -1, 2, 1, 0}
	// Q8_0 codes 0..31 with d = 0.5: values j/2.
	q8ramp := make([]int8, 32)
	for j := range q8ramp {
		q8ramp[j] = int8(j)
	}
	// Q4_0 with d = 2 (0x4000): code 9 at value 0 (+2), code 5 at value 16 (-6), the rest 8 (0).
	q4 := make([]byte, 18)
	q4[0], q4[1] = 0x00, 0x40
	for j := 2; j < 18; j++ {
		q4[j] = 0x88
	}
	q4[2] = 0x59
	a32 := make([]float32, 32)
	a32[0], a32[16] = 1, 0.5

	runCases(t, []opCase{
		{name: "f32", shape: core.Shape{2, 2}, build: func(g *core.Graph) *core.Tensor {
			return g.MatMul(c32(g, core.Shape{2, 3}, 1, 2, 3, 4, 5, 6), c32(g, core.Shape{2, 3}, b23...))
		}, want: []float32{-2, 4, -2, 13}},
		{name: "rank-1 a", shape: core.Shape{2}, build: func(g *core.Graph) *core.Tensor {
			return g.MatMul(c32(g, core.Shape{3}, 1, 2, 3), c32(g, core.Shape{2, 3}, b23...))
		}, want: []float32{-2, 4}},
		{name: "batched a, shared b", shape: core.Shape{2, 1, 2}, build: func(g *core.Graph) *core.Tensor {
			return g.MatMul(c32(g, core.Shape{2, 1, 2}, 1, 2, 3, 4), c32(g, core.Shape{1, 2, 2}, 1, 0, 0, 1))
		}, want: []float32{1, 2, 3, 4}},
		{name: "shared a, batched b", shape: core.Shape{2, 1, 2}, build: func(g *core.Graph) *core.Tensor {
			return g.MatMul(c32(g, core.Shape{1, 2}, 1, 1), c32(g, core.Shape{2, 2, 2}, 1, 2, 3, 4, 5, 6, 7, 8))
		}, want: []float32{3, 7, 11, 15}},
		{name: "batch broadcast both ways", shape: core.Shape{2, 2, 1, 1}, build: func(g *core.Graph) *core.Tensor {
			return g.MatMul(c32(g, core.Shape{2, 1, 1, 1}, 1, 10), c32(g, core.Shape{2, 1, 1}, 2, 3))
		}, want: []float32{2, 3, 20, 30}},
		{name: "f16 b", build: func(g *core.Graph) *core.Tensor {
			return g.MatMul(c32(g, core.Shape{1, 2}, 1, 2), c16(g, core.Shape{2, 2}, 0.5, 1.5, -1, 2))
		}, want: []float32{3.5, 3}},
		{name: "bf16 b", build: func(g *core.Graph) *core.Tensor {
			bf := []byte{0x00, 0x3f, 0xc0, 0x3f, 0x80, 0xbf, 0x00, 0x40} // 0.5, 1.5, -1, 2
			return g.MatMul(c32(g, core.Shape{1, 2}, 1, 2), g.Const("bf", core.BF16, core.Shape{2, 2}, bf))
		}, want: []float32{3.5, 3}},
		{name: "f16 a and b give f16", build: func(g *core.Graph) *core.Tensor {
			return g.MatMul(c16(g, core.Shape{1, 2}, 1, 2), c16(g, core.Shape{1, 2}, 0.5, 1.5))
		}, wantBytes: u16s(0x4300)}, // 3.5
		{name: "f16 result rounds once", build: func(g *core.Graph) *core.Tensor {
			// 1 + 2^-11 + 2^-24 is just above the f16 tie 1 + 2^-11: it rounds up to 1 + 2^-10.
			// Through f32 first it would become the tie and round to even (1).
			return g.MatMul(c16(g, core.Shape{1, 3}, 1, 1.0/2048, 1.0/(1<<24)), c16(g, core.Shape{1, 3}, 1, 1, 1))
		}, wantBytes: u16s(0x3c01)},
		{name: "q8_0 b", build: func(g *core.Graph) *core.Tensor {
			b := append(q8Row(2, -4), q8Row(q8ramp...)...)
			a := make([]float32, 32)
			a[0], a[1] = 3, 1
			x := c32(g, core.Shape{2, 32}, append(a, ones(32)...)...)
			return g.MatMul(x, g.Const("q8", core.Q8_0, core.Shape{2, 32}, b))
		}, want: []float32{3*1 + 1*-2, 3*0 + 1*0.5, 1 - 2, 248}},
		{name: "q4_0 b", build: func(g *core.Graph) *core.Tensor {
			x := c32(g, core.Shape{2, 32}, append(ones(32), a32...)...)
			return g.MatMul(x, g.Const("q4", core.Q4_0, core.Shape{1, 32}, q4))
		}, want: []float32{2 - 6, 2 - 3}},
		{name: "i8 b", build: func(g *core.Graph) *core.Tensor {
			b := g.Const("i8", core.I8, core.Shape{2, 2}, []byte{4, 0xf8, 1, 2}) // 1, -2, 0.25, 0.5
			return g.MatMulI8(c32(g, core.Shape{1, 2}, 2, 1), b, 0.25)
		}, want: []float32{0, 1}},
		{name: "M = 0", shape: core.Shape{0, 2}, build: func(g *core.Graph) *core.Tensor {
			return g.MatMul(c32(g, core.Shape{0, 3}), c32(g, core.Shape{2, 3}, b23...))
		}, want: []float32{}},
		{name: "N = 0", shape: core.Shape{2, 0}, build: func(g *core.Graph) *core.Tensor {
			return g.MatMul(c32(g, core.Shape{2, 3}, 1, 2, 3, 4, 5, 6), c32(g, core.Shape{0, 3}))
		}, want: []float32{}},
		{name: "K = 0 is an empty sum", shape: core.Shape{2, 3}, build: func(g *core.Graph) *core.Tensor {
			return g.MatMul(c32(g, core.Shape{2, 0}), c32(g, core.Shape{3, 0}))
		}, want: []float32{0, 0, 0, 0, 0, 0}},
	})
}
