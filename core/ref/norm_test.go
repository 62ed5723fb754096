package ref

import (
	"testing"

	"github.com/xpuhub/xpu/core"
)

func TestNormalization(t *testing.T) {
	runCases(t, []opCase{
		{name: "rms norm", build: func(g *core.Graph) *core.Tensor {
			return g.RMSNorm(c32(g, core.Shape{2, 2}, 3, 4, 1, 1), 0)
		}, want: []float32{0.8485281374, 1.1313708499, 1, 1}},
		{name: "rms norm eps", build: func(g *core.Graph) *core.Tensor {
			return g.RMSNorm(c32(g, core.Shape{2}, 0, 0), 1)
		}, want: []float32{0, 0}},
		{name: "rms norm eps shifts", build: func(g *core.Graph) *core.Tensor {
			return g.RMSNorm(c32(g, core.Shape{1}, 2), 5) // 2 / sqrt(4 + 5)
		}, want: []float32{0.6666666667}},
		{name: "layer norm", build: func(g *core.Graph) *core.Tensor {
			return g.LayerNorm(c32(g, core.Shape{1, 4}, 1, 2, 3, 4), 0)
		}, want: []float32{-1.3416407865, -0.4472135955, 0.4472135955, 1.3416407865}},
		{name: "rms norm f16", build: func(g *core.Graph) *core.Tensor {
			return g.RMSNorm(c16(g, core.Shape{2}, 3, 4), 0)
		}, wantBytes: u16s(0x3aca, 0x3c87)}, // 0.84853: 2^-1*(1+713.79/1024) -> 714; 1.13137: 1+134.52/1024 -> 135
		{name: "norm zero rows", shape: core.Shape{0, 4}, build: func(g *core.Graph) *core.Tensor {
			return g.LayerNorm(c32(g, core.Shape{0, 4}), 1e-5)
		}, want: []float32{}},
		{name: "softmax", build: func(g *core.Graph) *core.Tensor {
			return g.Softmax(c32(g, core.Shape{1, 3}, 1, 2, 3), 0)
		}, want: []float32{0.0900305732, 0.2447284711, 0.6652409558}},
		{name: "softmax scale", build: func(g *core.Graph) *core.Tensor {
			return g.Softmax(c32(g, core.Shape{3}, 0, 0.5, 1), 2)
		}, want: []float32{0.0900305732, 0.2447284711, 0.6652409558}},
		{name: "causal offset 1 ignores masked NaN", build: func(g *core.Graph) *core.Tensor {
			return g.CausalSoftmax(c32(g, core.Shape{2, 3}, 0, 0, nan, 0, 0, 0), 0, 1)
		}, want: []float32{0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3}},
		{name: "causal batched", build: func(g *core.Graph) *core.Tensor {
			return g.CausalSoftmax(c32(g, core.Shape{2, 2, 2}, 5, nan, 0, 1.0986122887, -1, 7, 1, 1), 0, 0)
		}, want: []float32{1, 0, 0.25, 0.75, 1, 0, 0.5, 0.5}},
		{name: "causal offset -1 row all masked", build: func(g *core.Graph) *core.Tensor {
			return g.CausalSoftmax(c32(g, core.Shape{2, 2}, nan, nan, 3, nan), 0, -1)
		}, want: []float32{0, 0, 1, 0}},
	})
}
