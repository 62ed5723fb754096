package ref

import (
	"math/rand/v2"
	"testing"

	"github.com/xpuhub/xpu/core"
)

// TestKQuantOps runs MATMUL, GET_ROWS, DEQUANTIZE and QUANTIZE on each K-quant. The expected
// values come from core.Dequantize (checked against ggml's golden blocks in core) and a float64
// dot product written here, so a wrong row stride or block index in the reference shows.
func TestKQuantOps(t *testing.T) {
	const n, k = 3, 2 * core.QKK
	r := rand.New(rand.NewPCG(5, 6))
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	a := make([]float32, 2*k)
	for i := range a {
		a[i] = float32(r.NormFloat64())
	}
	for _, dt := range []core.DType{core.Q4_K, core.Q5_K, core.Q6_K, core.Q2_K, core.Q3_K} {
		wb, err := core.Quantize(dt, w, 0)
		if err != nil {
			t.Fatal(err)
		}
		wq, err := core.Dequantize(dt, wb, 0)
		if err != nil {
			t.Fatal(err)
		}
		mm := make([]float32, 2*n)
		for m := 0; m < 2; m++ {
			for j := 0; j < n; j++ {
				var s float64
				for i := 0; i < k; i++ {
					s += float64(a[m*k+i]) * float64(wq[j*k+i])
				}
				mm[m*n+j] = float32(s)
			}
		}
		rows := append(append([]float32(nil), wq[2*k:3*k]...), wq[0:k]...)
		runCases(t, []opCase{
			{name: dt.String() + " matmul gemm", shape: core.Shape{2, n}, build: func(g *core.Graph) *core.Tensor {
				return g.MatMul(c32(g, core.Shape{2, k}, a...), g.Const("w", dt, core.Shape{n, k}, wb))
			}, want: mm, tol: 1e-5},
			{name: dt.String() + " matmul gemv", shape: core.Shape{n}, build: func(g *core.Graph) *core.Tensor {
				return g.MatMul(c32(g, core.Shape{k}, a[:k]...), g.Const("w", dt, core.Shape{n, k}, wb))
			}, want: mm[:n], tol: 1e-5},
			{name: dt.String() + " get_rows", shape: core.Shape{2, k}, build: func(g *core.Graph) *core.Tensor {
				return g.GetRows(g.Const("w", dt, core.Shape{n, k}, wb), ci32(g, core.Shape{2}, 2, 0))
			}, wantBytes: core.EncodeF32(rows)},
			{name: dt.String() + " dequantize", shape: core.Shape{n, k}, build: func(g *core.Graph) *core.Tensor {
				return g.Dequantize(g.Const("w", dt, core.Shape{n, k}, wb), 0)
			}, wantBytes: core.EncodeF32(wq)},
			{name: dt.String() + " quantize", shape: core.Shape{n, k}, build: func(g *core.Graph) *core.Tensor {
				return g.Quantize(c32(g, core.Shape{n, k}, w...), dt, 0)
			}, wantBytes: wb},
		})
	}
}
