package ref

import (
	"context"
	"testing"

	"github.com/xpuhub/xpu/core"
)

// BenchmarkMatMulQ4_0 is one decode-sized projection: a [1, 512] × Q4_0 b [512, 512].
func BenchmarkMatMulQ4_0(b *testing.B) {
	const k, n = 512, 512
	ws := make([]float32, n*k)
	for i := range ws {
		ws[i] = float32(i%13) - 6
	}
	wb, err := core.Quantize(core.Q4_0, ws, 0)
	if err != nil {
		b.Fatal(err)
	}
	g := core.NewGraph()
	x := g.Input("x", core.F32, 1, k)
	g.Output(g.MatMul(x, g.Const("w", core.Q4_0, core.Shape{n, k}, wb)))
	if err := g.Err(); err != nil {
		b.Fatal(err)
	}
	in := [][]byte{make([]byte, 4*k)}
	b.ResetTimer()
	for range b.N {
		if _, err := Run(context.Background(), g, in); err != nil {
			b.Fatal(err)
		}
	}
}
