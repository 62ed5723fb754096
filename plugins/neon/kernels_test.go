package neon_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/sched"
)

// kernelCase is a graph aimed at one code path of the plugin (block edges of the packed GEMM,
// the GEMV and int8 paths, batch broadcasting, f16 conversions, attention blocks), compared with
// core/ref by relative max error.
type kernelCase struct {
	name  string
	build func(g *core.Graph, rng *rand.Rand)
	tol   float64 // max |got-ref| / max(1, max|ref|)
}

func randF32(rng *rand.Rand, n int64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = rng.Float32()*2 - 1
	}
	return x
}

func constOf(g *core.Graph, rng *rand.Rand, name string, dt core.DType, shape ...int64) *core.Tensor {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	data, err := core.Quantize(dt, randF32(rng, n), 1.0/64)
	if dt == core.F32 {
		data, err = core.EncodeF32(randF32(rng, n)), nil
	}
	if err != nil {
		panic(err)
	}
	return g.Const(name, dt, core.Shape(shape), data)
}

func matmulCase(m, n, k int64, bt core.DType, tol float64) kernelCase {
	return kernelCase{
		name: fmt.Sprintf("matmul_%dx%dx%d_%s", m, n, k, bt),
		build: func(g *core.Graph, rng *rand.Rand) {
			a := g.Input("a", core.F32, m, k)
			w := constOf(g, rng, "w", bt, n, k)
			if bt == core.I8 {
				g.Output(g.MatMulI8(a, w, 1.0/64))
				return
			}
			g.Output(g.MatMul(a, w))
		},
		tol: tol,
	}
}

func kernelCases() []kernelCase {
	cs := []kernelCase{
		// GEMV path (M <= 3) and every edge of the blocked GEMM: K past one KC block, N past one
		// NC block, M and N not multiples of the register tile.
		matmulCase(1, 37, 300, core.F32, 1e-5),
		matmulCase(3, 64, 17, core.F32, 1e-5),
		matmulCase(4, 5, 1, core.F32, 1e-5),
		matmulCase(19, 1031, 520, core.F32, 1e-5),
		matmulCase(70, 33, 64, core.F16, 1e-5),
		// constant float weights packed at prepare (at most NV_FPACK_MAX): past one NC block of
		// rows, past one KC block of columns
		matmulCase(5, 1100, 230, core.F32, 1e-5),
		matmulCase(7, 100, 600, core.F16, 1e-5),
		// the small-M path on packed weights (k_matmul.c small_m): two row groups of 4, past one
		// NC block and one KC block; 9..32 rows within one KC block; 20 rows past it (the GEMM)
		matmulCase(8, 1030, 300, core.F32, 1e-5),
		matmulCase(6, 33, 64, core.BF16, 1e-5),
		matmulCase(21, 40, 200, core.F32, 1e-5),
		matmulCase(20, 40, 300, core.F32, 1e-5),
		matmulCase(1, 33, 64, core.BF16, 1e-5),
		matmulCase(9, 33, 64, core.BF16, 1e-5),
		matmulCase(2, 40, 96, core.I8, 1e-5),
		matmulCase(11, 40, 96, core.I8, 1e-5),
		matmulCase(1, 45, 256, core.Q8_0, 2e-2),
		matmulCase(13, 45, 256, core.Q4_0, 2e-2),
		matmulCase(3, 9, 96, core.Q8_0, 2e-2),
		matmulCase(6, 9, 64, core.Q4_0, 2e-2),
		{name: "matmul_batched_broadcast_f16", tol: 2e-3, build: func(g *core.Graph, rng *rand.Rand) {
			a := g.Input("a", core.F16, 2, 3, 6, 20)
			b := g.Input("b", core.F16, 3, 9, 20)
			g.Output(g.MatMul(a, b))
		}},
		{name: "matmul_rank1", tol: 1e-5, build: func(g *core.Graph, rng *rand.Rand) {
			a := g.Input("a", core.F32, 40)
			g.Output(g.MatMul(a, constOf(g, rng, "w", core.F32, 7, 40)))
		}},
		{name: "attention_long_gqa_causal_f16kv", tol: 2e-3, build: func(g *core.Graph, rng *rand.Rand) {
			q := g.Input("q", core.F32, 5, 8, 16)
			k := g.Input("k", core.F16, 100, 2, 16)
			v := g.Input("v", core.F16, 100, 2, 24)
			g.Output(g.Attention(q, k, v, core.AttentionOptions{Causal: true, QOffset: 70}))
		}},
		{name: "attention_noncausal_scale", tol: 1e-5, build: func(g *core.Graph, rng *rand.Rand) {
			q := g.Input("q", core.F32, 3, 4, 8)
			k := g.Input("k", core.F32, 67, 4, 8)
			v := g.Input("v", core.F32, 67, 4, 8)
			g.Output(g.Attention(q, k, v, core.AttentionOptions{Scale: 0.3}))
		}},
		{name: "rope_neox_partial_f16", tol: 2e-3, build: func(g *core.Graph, rng *rand.Rand) {
			x := g.Input("x", core.F16, 2, 7, 3, 20)
			pos := g.Const("pos", core.I32, core.Shape{7}, core.EncodeI32([]int32{0, 1, 5, 100, 4095, 7, 2}))
			g.Output(g.RoPE(x, pos, core.RoPEOptions{Mode: core.RoPENeoX, Dims: 12, Base: 500000}))
		}},
		{name: "rope_normal_large_positions", tol: 1e-5, build: func(g *core.Graph, rng *rand.Rand) {
			x := g.Input("x", core.F32, 3, 2, 64)
			pos := g.Const("pos", core.I32, core.Shape{3}, core.EncodeI32([]int32{8191, 30000, 3}))
			g.Output(g.RoPE(x, pos, core.RoPEOptions{}))
		}},
		// quantized activations in two matmuls: the conformance GRAPH bound for quantized weights
		{name: "block_q8_q4", tol: 5e-2, build: func(g *core.Graph, rng *rand.Rand) {
			x := g.Input("x", core.F32, 6, 64)
			h := g.RMSNorm(x, 1e-5)
			up := g.MatMul(h, constOf(g, rng, "wu", core.F32, 96, 64))
			gate := g.MatMul(h, constOf(g, rng, "wg", core.Q8_0, 96, 64))
			act := g.Mul(g.SiLU(gate), up)
			down := g.MatMul(act, constOf(g, rng, "wd", core.Q4_0, 64, 96))
			g.Output(g.Add(x, g.Softmax(down, 0.5)))
		}},
		{name: "binary_broadcast_f16", tol: 1e-3, build: func(g *core.Graph, rng *rand.Rand) {
			a := g.Input("a", core.F16, 3, 1, 5)
			b := g.Input("b", core.F16, 4, 1)
			g.Output(g.Div(g.Sub(a, b), g.Add(g.Mul(a, b), g.Input("c", core.F16))))
		}},
	}
	return cs
}

func inputsFor(g *core.Graph, rng *rand.Rand) [][]byte {
	var in [][]byte
	for _, t := range g.Inputs {
		xs := randF32(rng, t.Shape.NumElements())
		switch t.DType {
		case core.F16:
			b := make([]byte, 2*len(xs))
			for i, x := range xs {
				h := core.F32ToF16(x)
				b[2*i], b[2*i+1] = byte(h), byte(h>>8)
			}
			in = append(in, b)
		default:
			in = append(in, core.EncodeF32(xs))
		}
	}
	return in
}

func decodeAny(dt core.DType, b []byte) []float64 {
	out := make([]float64, 0, len(b)/2)
	switch dt {
	case core.F16:
		for i := 0; i+1 < len(b); i += 2 {
			out = append(out, float64(core.F16ToF32(uint16(b[i])|uint16(b[i+1])<<8)))
		}
	default:
		for _, v := range core.DecodeF32(b) {
			out = append(out, float64(v))
		}
	}
	return out
}

func TestKernelPaths(t *testing.T) {
	ctx := context.Background()
	// int8dot=0 keeps the quantized matmul on the baseline int8 path where the CPU has a dot
	// product instruction, so both paths run on every machine
	ctxOpts := []map[string]string{{"threads": "2"}, {"threads": "2", "int8dot": "0"}}
	for _, f := range pluginFiles(t) {
		b := openUsable(t, f)
		dev := b.Devices()[0]
		for _, opts := range ctxOpts {
			for _, kc := range kernelCases() {
				runKernelCase(t, ctx, dev, filepath.Base(f)+"/int8dot="+opts["int8dot"]+"/"+kc.name, kc, opts)
			}
		}
	}
}

// runKernelCase runs kc on dev in a context with opts and compares every output with core/ref.
func runKernelCase(t *testing.T, ctx context.Context, dev core.Device, name string, kc kernelCase,
	opts map[string]string) {
	t.Run(name, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(uint64(len(kc.name)), 7))
		g := core.NewGraph()
		kc.build(g, rng)
		require.NoError(t, g.Err())
		in := inputsFor(g, rng)
		want, err := ref.Run(ctx, g, in)
		require.NoError(t, err)
		s, err := sched.NewSession(ctx, g, []core.Device{dev}, sched.Strict(), sched.WithContextOptions(opts))
		require.NoError(t, err)
		defer s.Close()
		got, err := s.Run(ctx, in)
		require.NoError(t, err)
		for i, out := range g.Outputs {
			gv, wv := decodeAny(out.DType, got[i]), decodeAny(out.DType, want[i])
			require.Len(t, gv, len(wv))
			worst, at, peak := maxError(gv, wv)
			require.LessOrEqual(t, worst/peak, kc.tol, "output %d: max error %g at element %d, peak %g", i, worst, at, peak)
		}
	})
}

// maxError returns the largest |got-want|, the index where it is, and the reference's peak
// (at least 1). A NaN or infinity that the reference does not have at the same place is an
// infinite error, kept whatever follows: the comparison `!(e <= worst)` used before let the
// next finite error replace a NaN, so a kernel writing NaN passed.
func maxError(got, want []float64) (worst float64, at int, peak float64) {
	peak = 1
	for _, w := range want {
		if !math.IsInf(w, 0) && !math.IsNaN(w) {
			peak = math.Max(peak, math.Abs(w))
		}
	}
	at = -1
	for j := range want {
		g, w := got[j], want[j]
		var e float64
		switch {
		case math.IsNaN(w) || math.IsInf(w, 0):
			if g != w && !(math.IsNaN(g) && math.IsNaN(w)) {
				e = math.Inf(1)
			}
		case math.IsNaN(g) || math.IsInf(g, 0):
			e = math.Inf(1)
		default:
			e = math.Abs(g - w)
		}
		if e > worst || at < 0 {
			worst, at = e, j
		}
		if math.IsInf(worst, 1) {
			break
		}
	}
	return worst, at, peak
}

// TestMaxErrorCannotHideAFault plants faults where the old comparison lost them.
func TestMaxErrorCannotHideAFault(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	cases := []struct {
		name      string
		got, want []float64
		worst     float64
		at        int
	}{
		{"equal", []float64{1, 2}, []float64{1, 2}, 0, 0},
		{"NaN then a small error", []float64{nan, 2.5}, []float64{1, 2}, inf, 0},
		{"large error then a small one", []float64{9, 2.5}, []float64{1, 2}, 8, 0},
		{"infinity where the reference is finite", []float64{1, inf}, []float64{1, 2}, inf, 1},
		{"NaN where the reference is NaN", []float64{nan, 2}, []float64{nan, 2}, 0, 0},
		{"the reference's infinity matched", []float64{-inf, 2}, []float64{-inf, 2}, 0, 0},
		{"the wrong infinity", []float64{inf, 2}, []float64{-inf, 2}, inf, 0},
		{"finite where the reference is NaN", []float64{0, 2}, []float64{nan, 2}, inf, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			worst, at, peak := maxError(c.got, c.want)
			require.Equal(t, c.worst, worst)
			require.Equal(t, c.at, at)
			require.GreaterOrEqual(t, peak, 1.0)
			require.False(t, math.IsNaN(worst/peak), "a NaN ratio would pass LessOrEqual's check silently")
		})
	}
}
