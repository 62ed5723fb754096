package ref

import (
	"math"
	"testing"

	"github.com/xpuhub/xpu/core"
)

func TestElementwise(t *testing.T) {
	inf := float32(math.Inf(1))
	runCases(t, []opCase{
		{name: "add row broadcast", shape: core.Shape{2, 3},
			build: func(g *core.Graph) *core.Tensor {
				return g.Add(c32(g, core.Shape{2, 3}, 1, 2, 3, 4, 5, 6), c32(g, core.Shape{3}, 10, 20, 30))
			},
			want: []float32{11, 22, 33, 14, 25, 36}},
		{name: "add outer broadcast", shape: core.Shape{2, 3},
			build: func(g *core.Graph) *core.Tensor {
				return g.Add(c32(g, core.Shape{2, 1}, 1, 2), c32(g, core.Shape{1, 3}, 10, 20, 30))
			},
			want: []float32{11, 21, 31, 12, 22, 32}},
		{name: "sub scalar", shape: core.Shape{2},
			build: func(g *core.Graph) *core.Tensor {
				return g.Sub(c32(g, core.Shape{2}, 5, 7), c32(g, core.Shape{}, 2))
			},
			want: []float32{3, 5}},
		{name: "mul rank 3 by rank 2", shape: core.Shape{2, 3, 2},
			build: func(g *core.Graph) *core.Tensor {
				return g.Mul(c32(g, core.Shape{2, 1, 2}, 1, 2, 3, 4), c32(g, core.Shape{3, 1}, 1, 10, 100))
			},
			want: []float32{1, 2, 10, 20, 100, 200, 3, 4, 30, 40, 300, 400}},
		{name: "div ieee", build: func(g *core.Graph) *core.Tensor {
			return g.Div(c32(g, core.Shape{4}, 1, -1, 0, 6), c32(g, core.Shape{4}, 0, 0, 0, 4))
		}, want: []float32{inf, -inf, nan, 1.5}},
		{name: "add f16", build: func(g *core.Graph) *core.Tensor {
			return g.Add(c16(g, core.Shape{2}, 1, 2), c16(g, core.Shape{2}, 0.5, 0.25))
		}, wantBytes: u16s(0x3e00, 0x4080)}, // 1.5, 2.25
		{name: "add zero-size", shape: core.Shape{0, 3}, build: func(g *core.Graph) *core.Tensor {
			return g.Add(c32(g, core.Shape{0, 3}), c32(g, core.Shape{3}, 1, 2, 3))
		}, want: []float32{}},
		{name: "silu", build: func(g *core.Graph) *core.Tensor { return g.SiLU(c32(g, core.Shape{3}, 0, 1, -1)) },
			want: []float32{0, 0.7310585786, -0.2689414214}},
		{name: "gelu", build: func(g *core.Graph) *core.Tensor { return g.GELU(c32(g, core.Shape{4}, 0, 1, -1, 2)) },
			want: []float32{0, 0.8411919906, -0.1588080094, 1.9545976941}},
		{name: "relu", build: func(g *core.Graph) *core.Tensor { return g.ReLU(c32(g, core.Shape{3}, -1, 0, 2.5)) },
			want: []float32{0, 0, 2.5}},
		{name: "exp", build: func(g *core.Graph) *core.Tensor { return g.Exp(c32(g, core.Shape{3}, 0, 1, -1)) },
			want: []float32{1, 2.7182818285, 0.3678794412}},
		{name: "neg", build: func(g *core.Graph) *core.Tensor { return g.Neg(c32(g, core.Shape{3}, 1, -2, 0)) },
			wantBytes: core.EncodeF32([]float32{-1, 2, float32(math.Copysign(0, -1))})},
		{name: "scale", build: func(g *core.Graph) *core.Tensor { return g.Scale(c32(g, core.Shape{2}, 1, 2), 3, 0.5) },
			want: []float32{3.5, 6.5}},
		{name: "silu zero-size", shape: core.Shape{0}, build: func(g *core.Graph) *core.Tensor { return g.SiLU(c32(g, core.Shape{0})) },
			want: []float32{}},
		{name: "scale rank 0", shape: core.Shape{}, build: func(g *core.Graph) *core.Tensor { return g.Scale(c32(g, core.Shape{}, 4), -1, 0) },
			want: []float32{-4}},
	})
}
