package ref

import (
	"testing"

	"github.com/xpuhub/xpu/core"
)

func TestRoPE(t *testing.T) {
	x6 := []float32{1, 2, 3, 4, 5, 6}
	runCases(t, []opCase{
		{name: "normal full head", build: func(g *core.Graph) *core.Tensor {
			// theta_0 = 1, theta_1 = 10000^(-2/4) = 0.01
			return g.RoPE(c32(g, core.Shape{1, 1, 4}, 1, 0, 1, 0), ci32(g, core.Shape{1}, 1), core.RoPEOptions{})
		}, want: []float32{0.5403023059, 0.8414709848, 0.9999500004, 0.0099998333}},
		{name: "normal n_rot 4 of 6", build: func(g *core.Graph) *core.Tensor {
			// base 100: theta_0 = 1, theta_1 = 100^(-1/2) = 0.1; pairs (0,1), (2,3); 4, 5 copied
			return g.RoPE(c32(g, core.Shape{1, 1, 6}, x6...), ci32(g, core.Shape{1}, 1),
				core.RoPEOptions{Dims: 4, Base: 100})
		}, want: []float32{-1.1426396637, 1.9220755965, 2.5856788292, 4.2795169111, 5, 6}},
		{name: "neox n_rot 4 of 6", build: func(g *core.Graph) *core.Tensor {
			// pairs (0,2) with theta 1 and (1,3) with theta 0.1
			return g.RoPE(c32(g, core.Shape{1, 1, 6}, x6...), ci32(g, core.Shape{1}, 1),
				core.RoPEOptions{Mode: core.RoPENeoX, Dims: 4, Base: 100})
		}, want: []float32{-1.9841106486, 1.590674664, 2.4623779024, 4.1796834944, 5, 6}},
		{name: "two tokens two heads", build: func(g *core.Graph) *core.Tensor {
			x := c32(g, core.Shape{2, 2, 2}, 1, 0, 0, 1, 1, 0, 0, 1)
			return g.RoPE(x, ci32(g, core.Shape{2}, 0, 1), core.RoPEOptions{})
		}, want: []float32{1, 0, 0, 1, 0.5403023059, 0.8414709848, -0.8414709848, 0.5403023059}},
		{name: "batched with freq scale", build: func(g *core.Graph) *core.Tensor {
			// theta = 1 * 0.5
			x := c32(g, core.Shape{2, 1, 1, 2}, 1, 0, 0, 2)
			return g.RoPE(x, ci32(g, core.Shape{1}, 1), core.RoPEOptions{FreqScale: 0.5})
		}, want: []float32{0.8775825619, 0.4794255386, -0.9588510772, 1.7551651238}},
		{name: "zero tokens", shape: core.Shape{0, 2, 4}, build: func(g *core.Graph) *core.Tensor {
			return g.RoPE(c32(g, core.Shape{0, 2, 4}), ci32(g, core.Shape{0}), core.RoPEOptions{})
		}, want: []float32{}},
	})
}
