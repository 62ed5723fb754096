package kernelbench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// graphRun prepares g on dev (threads()) with its inputs bound and returns one synchronous run.
func graphRun(b *testing.B, dev core.Device, g *core.Graph, inputs [][]byte) func() {
	b.Helper()
	require.NoError(b, g.Err())
	ctx := context.Background()
	cctx, err := dev.NewContext(ctx, map[string]string{"threads": strconv.Itoa(threads())})
	require.NoError(b, err)
	b.Cleanup(func() { _ = cctx.Close() })
	exe, err := cctx.Prepare(ctx, g)
	require.NoError(b, err)
	b.Cleanup(func() { _ = exe.Close() })
	ex, err := exe.NewExecution()
	require.NoError(b, err)
	b.Cleanup(func() { _ = ex.Close() })
	for io := 0; io < len(g.Inputs)+len(g.Outputs); io++ {
		t, err := g.Binding(io)
		require.NoError(b, err)
		buf, err := cctx.Alloc(t.Bytes(), core.BufferDevice)
		require.NoError(b, err)
		b.Cleanup(func() { _ = buf.Close() })
		if io < len(inputs) {
			require.NoError(b, buf.Write(0, inputs[io]))
		}
		require.NoError(b, ex.Bind(io, buf, 0))
	}
	return func() {
		if err := ex.Run(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func randCodes(rng *rand.Rand, n int64) []byte {
	q := make([]byte, n)
	for i := range q {
		q[i] = byte(int8(rng.IntN(255) - 127))
	}
	return q
}

// BenchmarkW8A8GEMV (issue 16): the decode GEMV of the 1B model's shapes (2048x2048, the FFN's
// 5632x2048) with an I8 activation and I8 weights (exact int32 sums), next to the Q8_0 GEMV
// (activations quantized to Q8_0 blocks on the fly), in GB/s of the weight bytes. Sub-benchmarks
// of a shape run back to back; -count N interleaves the rounds.
func BenchmarkW8A8GEMV(b *testing.B) {
	for _, s := range []Shape{{1, 2048, 2048}, {1, 5632, 2048}} {
		b.Run(fmt.Sprintf("%s/q8_0/neon", s), func(b *testing.B) {
			reportGBs(b, core.Q8_0.Bytes(s.N*s.K), timed(b, matmulRun(b, device(b, "neon"), s, core.Q8_0)))
		})
		for _, v := range []struct {
			name string
			o    func(g *core.Graph) core.W8A8Options
		}{
			{"w8a8", func(*core.Graph) core.W8A8Options { return core.W8A8Options{AScale: 0.01, BScale: 0.01} }},
			{"w8a8-perchannel-grid", func(g *core.Graph) core.W8A8Options {
				sc := make([]float32, s.N)
				for i := range sc {
					sc[i] = 0.01
				}
				return core.W8A8Options{AScale: 0.01, BScales: g.Const("s", core.F32, core.Shape{s.N}, core.EncodeF32(sc)),
					OutScale: 1e-3}
			}},
		} {
			b.Run(fmt.Sprintf("%s/%s/neon", s, v.name), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, 2))
				g := core.NewGraph()
				a := g.Input("a", core.I8, s.M, s.K)
				w := g.Const("w", core.I8, core.Shape{s.N, s.K}, randCodes(rng, s.N*s.K))
				g.Output(g.MatMulW8A8(a, w, v.o(g)))
				run := graphRun(b, device(b, "neon"), g, [][]byte{randCodes(rng, s.M*s.K)})
				reportGBs(b, s.N*s.K, timed(b, run))
			})
		}
	}
}

// BenchmarkShadowMatMul (issue 16): SHADOW_MATMUL of one 2048-wide activation row against all
// 2048 channels' weight columns (N = 2048, f32) with 0 to 2048 outliers: the cost should follow
// the outlier count (a dense 2048x2048 f32 GEMV is the last row's work).
func BenchmarkShadowMatMul(b *testing.B) {
	const K, N = 2048, 2048
	rng := rand.New(rand.NewPCG(3, 4))
	wt := make([]float32, K*N)
	for i := range wt {
		wt[i] = rng.Float32()*2 - 1
	}
	wtb := core.EncodeF32(wt)
	for _, outliers := range []int{0, 8, 64, 512, 2048} {
		b.Run(fmt.Sprintf("outliers=%d/neon", outliers), func(b *testing.B) {
			x := make([]float32, K)
			for i := range x {
				x[i] = rng.Float32()*2 - 1 // inside the clip at t = 1
			}
			for _, c := range rng.Perm(K)[:outliers] {
				x[c] = 3
			}
			g := core.NewGraph()
			g.Output(g.ShadowMatMul(g.Input("x", core.F32, 1, K), g.Const("wt", core.F32, core.Shape{K, N}, wtb), nil, 1))
			timed(b, graphRun(b, device(b, "neon"), g, [][]byte{core.EncodeF32(x)}))
		})
	}
}
