package ref

import (
	"testing"

	"github.com/xpuhub/xpu/core"
)

func TestDataMovement(t *testing.T) {
	x6 := []float32{1, 2, 3, 4, 5, 6}
	x8 := []float32{0, 1, 2, 3, 4, 5, 6, 7}
	runCases(t, []opCase{
		{name: "reshape", shape: core.Shape{3, 2}, build: func(g *core.Graph) *core.Tensor {
			return g.Reshape(c32(g, core.Shape{2, 3}, x6...), 3, 2)
		}, wantBytes: core.EncodeF32(x6)},
		{name: "reshape q8_0 keeps bytes", build: func(g *core.Graph) *core.Tensor {
			q := g.Const("q", core.Q8_0, core.Shape{2, 32}, append(q8Row(1, 2), q8Row(3)...))
			return g.Dequantize(g.Reshape(q, 64), 0)
		}, want: func() []float32 {
			xs := make([]float32, 64)
			xs[0], xs[1], xs[32] = 0.5, 1, 1.5
			return xs
		}()},
		{name: "permute 2-d", shape: core.Shape{3, 2}, build: func(g *core.Graph) *core.Tensor {
			return g.Permute(c32(g, core.Shape{2, 3}, x6...), 1, 0)
		}, wantBytes: core.EncodeF32([]float32{1, 4, 2, 5, 3, 6})},
		{name: "permute 3-d", shape: core.Shape{3, 1, 2}, build: func(g *core.Graph) *core.Tensor {
			// out[i, 0, k] = x[0, k, i]
			return g.Permute(c32(g, core.Shape{1, 2, 3}, 0, 1, 2, 3, 4, 5), 2, 0, 1)
		}, wantBytes: core.EncodeF32([]float32{0, 3, 1, 4, 2, 5})},
		{name: "permute 4-d i32", shape: core.Shape{2, 1, 2, 2}, build: func(g *core.Graph) *core.Tensor {
			// x [2,2,1,2] (T,H,1,D) -> perm (1,2,0,3): out[h,0,t,d] = x[t,h,0,d]
			return g.Permute(ci32(g, core.Shape{2, 2, 1, 2}, 0, 1, 2, 3, 4, 5, 6, 7), 1, 2, 0, 3)
		}, wantBytes: core.EncodeI32([]int32{0, 1, 4, 5, 2, 3, 6, 7})},
		{name: "permute f16 keeps NaN payload", build: func(g *core.Graph) *core.Tensor {
			return g.Permute(g.Const("h", core.F16, core.Shape{2, 1}, u16s(0x7e01, 0x3c00)), 1, 0)
		}, wantBytes: u16s(0x7e01, 0x3c00)},
		{name: "slice inner axis", shape: core.Shape{2, 2}, build: func(g *core.Graph) *core.Tensor {
			return g.Slice(c32(g, core.Shape{2, 4}, x8...), 1, 1, 2)
		}, wantBytes: core.EncodeF32([]float32{1, 2, 5, 6})},
		{name: "slice outer axis", shape: core.Shape{1, 4}, build: func(g *core.Graph) *core.Tensor {
			return g.Slice(c32(g, core.Shape{2, 4}, x8...), 0, 1, 1)
		}, wantBytes: core.EncodeF32([]float32{4, 5, 6, 7})},
		{name: "slice middle axis i8", shape: core.Shape{2, 1, 2}, build: func(g *core.Graph) *core.Tensor {
			x := g.Const("i8", core.I8, core.Shape{2, 2, 2}, []byte{0, 1, 2, 3, 4, 5, 6, 7})
			return g.Slice(x, 1, 1, 1)
		}, wantBytes: []byte{2, 3, 6, 7}},
		{name: "slice empty", shape: core.Shape{2, 0}, build: func(g *core.Graph) *core.Tensor {
			return g.Slice(c32(g, core.Shape{2, 4}, x8...), 1, 4, 0)
		}, wantBytes: []byte{}},
		{name: "concat of 3 inner axis", shape: core.Shape{2, 4}, build: func(g *core.Graph) *core.Tensor {
			a := c32(g, core.Shape{2, 1}, 1, 2)
			b := c32(g, core.Shape{2, 2}, 3, 4, 5, 6)
			c := c32(g, core.Shape{2, 1}, 7, 8)
			return g.Concat(1, a, b, c)
		}, wantBytes: core.EncodeF32([]float32{1, 3, 4, 7, 2, 5, 6, 8})},
		{name: "concat of 3 outer axis i32", shape: core.Shape{4, 1}, build: func(g *core.Graph) *core.Tensor {
			return g.Concat(0, ci32(g, core.Shape{1, 1}, 1), ci32(g, core.Shape{2, 1}, 2, 3), ci32(g, core.Shape{1, 1}, 4))
		}, wantBytes: core.EncodeI32([]int32{1, 2, 3, 4})},
		{name: "concat with an empty part", shape: core.Shape{2, 2}, build: func(g *core.Graph) *core.Tensor {
			return g.Concat(1, c32(g, core.Shape{2, 0}), c32(g, core.Shape{2, 2}, 1, 2, 3, 4))
		}, wantBytes: core.EncodeF32([]float32{1, 2, 3, 4})},
	})
}
