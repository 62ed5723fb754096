package ref

import (
	"context"
	"math"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

func TestSparseFFN(t *testing.T) {
	nan := float32(math.NaN())
	// Gated rows of D = 2 plus one padding value (NaN: never read).
	// row 0: gate [1 0], up [0 1], down [1 1]; row 1: gate [-1 0], up [1 1], down [10 10];
	// row 2: gate [1 1], up [1 0], down [0 2].
	gated := func(g *core.Graph) *core.Tensor {
		return c32(g, core.Shape{3, 7},
			1, 0, 0, 1, 1, 1, nan,
			-1, 0, 1, 1, 10, 10, nan,
			1, 1, 1, 0, 0, 2, nan)
	}
	x1 := func(g *core.Graph) *core.Tensor { return c32(g, core.Shape{1, 2}, 1, 2) }
	ffn := func(x func(*core.Graph) *core.Tensor, b func(*core.Graph) *core.Tensor, o core.SparseFFNOptions, idx ...int32) func(*core.Graph) *core.Tensor {
		return func(g *core.Graph) *core.Tensor {
			return g.SparseFFN(x(g), b(g), ci32(g, core.Shape{int64(len(idx))}, idx...), o)
		}
	}
	// silu(1), silu(-1), silu(3)
	s1, sm1, s3 := 1/(1+math.Exp(-1)), -1/(1+math.Exp(1)), 3/(1+math.Exp(-3))
	runCases(t, []opCase{
		// x = [1 2]: row 0 h = 1·2 = 2 (listed twice), row 1 gate -1 → skipped, row 2 h = 3·1.
		{name: "relu", build: ffn(x1, gated, core.SparseFFNOptions{}, 0, -1, 2, 0, 1),
			shape: core.Shape{1, 2}, want: []float32{4, 10}},
		{name: "relu2", build: ffn(x1, gated, core.SparseFFNOptions{Act: core.SparseReLU2}, 0, -1, 2, 0, 1),
			want: []float32{4, 22}},
		{name: "silu", build: ffn(x1, gated, core.SparseFFNOptions{Act: core.SparseSiLU}, 0, -1, 2, 0, 1),
			want: []float32{float32(4*s1 + 30*sm1), float32(4*s1 + 2*s3 + 30*sm1)}},
		{name: "rank-1 x", build: ffn(func(g *core.Graph) *core.Tensor { return c32(g, core.Shape{2}, 1, 2) }, gated,
			core.SparseFFNOptions{}, 2), shape: core.Shape{2}, want: []float32{0, 6}},
		// x row 1 = [-1 0]: rows 0 and 2 have gate -1 (skipped), row 1 gate 1 and up -1.
		{name: "M = 2", build: ffn(func(g *core.Graph) *core.Tensor { return c32(g, core.Shape{2, 2}, 1, 2, -1, 0) }, gated,
			core.SparseFFNOptions{}, 0, 2, 1), want: []float32{2, 8, -10, -10}},
		{name: "all slots empty", build: ffn(x1, gated, core.SparseFFNOptions{}, -1, -1), want: []float32{0, 0}},
		{name: "no slots", build: ffn(x1, gated, core.SparseFFNOptions{}), want: []float32{0, 0}},
		// A zero gate skips the up and down segments: their NaNs never reach the output.
		{name: "zero gate skips up and down", build: ffn(x1, func(g *core.Graph) *core.Tensor {
			return c32(g, core.Shape{2, 6}, -1, 0, nan, nan, nan, nan, 0, 1, 1, 0, 3, 4)
		}, core.SparseFFNOptions{}, 0, 1), want: []float32{6, 8}},
		// A live gate times a zero up·x still multiplies down: 0·Inf is NaN as in the dense FFN.
		{name: "zero up with live gate", build: ffn(x1, func(g *core.Graph) *core.Tensor {
			return c32(g, core.Shape{1, 6}, 1, 0, 0, 0, float32(math.Inf(1)), 0)
		}, core.SparseFFNOptions{}, 0), want: []float32{nan, 0}},
		// Ungated rows: up [1 0] down [1 2]; up [-1 0] down NaN (skipped).
		{name: "ungated", build: ffn(x1, func(g *core.Graph) *core.Tensor {
			return c32(g, core.Shape{2, 5}, 1, 0, 1, 2, nan, -1, 0, nan, nan, nan)
		}, core.SparseFFNOptions{Ungated: true}, 1, 0), want: []float32{1, 2}},
		{name: "f16 x and bundles", build: ffn(func(g *core.Graph) *core.Tensor { return c16(g, core.Shape{2}, 1, 2) },
			func(g *core.Graph) *core.Tensor { return c16(g, core.Shape{1, 6}, 1, 0, 0, 1, 1, 1) },
			core.SparseFFNOptions{}, 0), want: []float32{2, 2}},
	})
}

// TestSparseFFNMatchesDense checks quantized bundles against the dense FFN over the listed
// neurons, computed here from the dequantized bundles.
func TestSparseFFNMatchesDense(t *testing.T) {
	const D, S, M = 64, 5, 3
	rng := rand.New(rand.NewSource(18))
	for _, dt := range []core.DType{core.F32, core.F16, core.Q8_0, core.Q4_0} {
		for _, ungated := range []bool{false, true} {
			R := int64(3*D + 32)
			vals := make([]float32, S*R)
			for i := range vals {
				vals[i] = float32(rng.NormFloat64())
			}
			b, err := core.Quantize(dt, vals, 0)
			require.NoError(t, err)
			deq, err := core.Dequantize(dt, b, 0)
			require.NoError(t, err)
			x := make([]float32, M*D)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			idx := []int32{3, -1, 0, 3, 4}
			want := make([]float32, M*D)
			for m := 0; m < M; m++ {
				for _, id := range idx {
					if id < 0 {
						continue
					}
					row := deq[int64(id)*R:]
					dot := func(seg int) float64 {
						var acc float64
						for i := 0; i < D; i++ {
							acc += float64(row[seg*D+i]) * float64(x[m*D+i])
						}
						return acc
					}
					h, down := math.Max(dot(0), 0), row[2*D:]
					if ungated {
						down = row[D:]
					} else {
						h *= dot(1)
					}
					for i := 0; i < D; i++ {
						want[m*D+i] += float32(h * float64(down[i]))
					}
				}
			}
			g := core.NewGraph()
			g.Output(g.SparseFFN(g.Const("x", core.F32, core.Shape{M, D}, core.EncodeF32(x)),
				g.Input("bundles", dt, S, R), g.Input("idx", core.I32, int64(len(idx))), core.SparseFFNOptions{Ungated: ungated}))
			require.NoError(t, g.Err())
			res, err := Run(context.Background(), g, [][]byte{b, core.EncodeI32(idx)})
			require.NoError(t, err, "%s ungated=%v", dt, ungated)
			got := core.DecodeF32(res[0])
			for i := range want {
				assert.InDelta(t, want[i], got[i], 1e-4*math.Max(1, math.Abs(float64(want[i]))), "%s ungated=%v value %d", dt, ungated, i)
			}
		}
	}
}

func TestSparseFFNIndexOutOfRange(t *testing.T) {
	g := core.NewGraph()
	g.Output(g.SparseFFN(g.Input("x", core.F32, 1, 2), g.Input("b", core.F32, 3, 6), g.Input("idx", core.I32, 2), core.SparseFFNOptions{}))
	require.NoError(t, g.Err())
	for _, id := range []int32{-2, 3, math.MaxInt32} {
		_, err := Run(context.Background(), g, [][]byte{make([]byte, 8), make([]byte, 72), core.EncodeI32([]int32{0, id})})
		assert.ErrorIs(t, err, core.ErrInvalidArgument, "id %d", id)
	}
}
