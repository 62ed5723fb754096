package conformance

import (
	"math"

	"github.com/xpuhub/xpu/core"
)

// Op set 3: MATMUL with an I8 activation (per-tensor and per-channel weight scales,
// with and without the 16-bit output grid, f32 and f16 outputs), the W8A8 linear-layer chain
// QUANTIZE(x → I8) → MATMUL + SHADOW_MATMUL, and SHADOW_MATMUL alone (no outliers, dense
// outliers, an ids subset, duplicates, rank 1, f16 weights, NaN, a bad id).

// w8a8Scales are the case's activation and weight scales: codes span ±127, so a·b values span
// about ±1 and sums over K stay O(√K).
const (
	w8a8AScale = 1.0 / 127
	w8a8BScale = 0.5 / 127
)

// w8a8Grid is the output grid step for K: 5σ of the product (σ ≈ √K·127²/3 in codes) spread
// over the 32767 steps, so a one-step difference at a rounding tie (a backend computing in f32,
// OPS.md) is about 5e-5 of the peak. coarse divides the range by 10: many values clamp.
func w8a8Grid(K int64, coarse bool) float32 {
	sigma := math.Sqrt(float64(max(K, 1))) * 127 * 127 / 3 * w8a8AScale * w8a8BScale
	so := 5 * sigma / 32767
	if coarse {
		so /= 10
	}
	return float32(so)
}

func w8a8Cases() []testCase {
	type mm struct {
		a, b   core.Shape
		const_ bool
	}
	shapes := []mm{
		{core.Shape{1, 32}, core.Shape{1, 32}, true}, {core.Shape{1, 64}, core.Shape{33, 64}, true},
		{core.Shape{1, 256}, core.Shape{64, 256}, true}, {core.Shape{5, 96}, core.Shape{17, 96}, true},
		{core.Shape{16, 256}, core.Shape{64, 256}, true}, {core.Shape{3, 33}, core.Shape{7, 33}, true},
		{core.Shape{3, 64}, core.Shape{9, 64}, false}, {core.Shape{2, 3, 40}, core.Shape{9, 40}, true},
		{core.Shape{40}, core.Shape{8, 40}, true}, {core.Shape{0, 32}, core.Shape{4, 32}, true},
		{core.Shape{1, 2048}, core.Shape{48, 2048}, true},
	}
	type variant struct {
		name       string
		perChannel bool
		grid       int // 0 none, 1 fine, 2 coarse (clamps)
		out        core.DType
	}
	variants := []variant{
		{"per_tensor", false, 0, core.F32}, {"per_channel", true, 0, core.F32},
		{"per_tensor_grid", false, 1, core.F32}, {"per_channel_grid", true, 1, core.F32},
		{"per_channel_grid_clamp", true, 2, core.F32}, {"per_channel_f16", true, 0, core.F16},
		{"per_tensor_grid_f16", false, 1, core.F16},
	}
	var cs []testCase
	for _, v := range variants {
		for _, s := range shapes {
			cs = append(cs, graphCase(2, "MATMUL", "i8/i8",
				caseName("MATMUL", "a", core.I8, "b", core.I8, "scales", v.name, "out", v.out,
					"a_shape", s.a, "b_shape", s.b, "b_const", s.const_),
				graphSpec{build: func(b *builder) {
					a := b.in("a", core.I8, s.a, 0, 0)
					var w *core.Tensor
					if s.const_ {
						w = b.cnst("b", core.I8, s.b, 0, 0)
					} else {
						w = b.in("b", core.I8, s.b, 0, 0)
					}
					o := w8a8Options(b, s.b, v.perChannel, v.out)
					if v.grid > 0 {
						o.OutScale = w8a8Grid(s.b[1], v.grid == 2)
					}
					b.g.Output(b.g.MatMulW8A8(a, w, o))
				}}))
		}
	}
	// Extreme codes: -128 (legal in an I8 tensor though QUANTIZE never makes it) breaks the
	// sign and unsigned-offset tricks of int8 dot instructions; K odd leaves a tail.
	for _, s := range []mm{{core.Shape{1, 1000}, core.Shape{19, 1000}, true}, {core.Shape{3, 77}, core.Shape{5, 77}, false}} {
		cs = append(cs, graphCase(2, "MATMUL", "i8/i8",
			caseName("MATMUL", "a", core.I8, "b", core.I8, "scales", "extreme_codes", "a_shape", s.a, "b_shape", s.b),
			graphSpec{build: func(b *builder) {
				codes := func(n int64) []byte {
					out := make([]byte, n)
					for i := range out {
						out[i] = []byte{0x80, 0x7F, 0x81, 0x80}[b.r.IntN(4)]
					}
					return out
				}
				a := b.inData("a", core.I8, s.a, codes(s.a.NumElements()))
				var w *core.Tensor
				if s.const_ {
					w = b.g.Const("b", core.I8, s.b, codes(s.b.NumElements()))
				} else {
					w = b.inData("b", core.I8, s.b, codes(s.b.NumElements()))
				}
				b.g.Output(b.g.MatMulW8A8(a, w, core.W8A8Options{AScale: w8a8AScale, BScale: w8a8BScale}))
			}}))
	}
	// Float activations with per-channel I8 weight scales (v3, no I8 a).
	for _, adt := range floatDTypes {
		for _, s := range []mm{{core.Shape{1, 64}, core.Shape{33, 64}, true}, {core.Shape{5, 40}, core.Shape{9, 40}, true}} {
			cs = append(cs, graphCase(2, "MATMUL", adt.String()+"/i8",
				caseName("MATMUL", "a", adt, "b", core.I8, "scales", "per_channel", "a_shape", s.a, "b_shape", s.b),
				graphSpec{build: func(b *builder) {
					o := w8a8Options(b, s.b, true, 0)
					o.AScale = 0 // a float a carries its own values
					b.g.Output(b.g.MatMulW8A8(b.in("a", adt, s.a, -1, 1), b.cnst("b", core.I8, s.b, 0, 0), o))
				}}))
		}
	}
	return append(cs, shadowCases()...)
}

// w8a8Options: the case's scales; per-channel scales are a constant F32 [N] within a factor of
// 4 of each other.
func w8a8Options(b *builder, bs core.Shape, perChannel bool, out core.DType) core.W8A8Options {
	o := core.W8A8Options{AScale: w8a8AScale, BScale: w8a8BScale, Out: out}
	if perChannel {
		o.BScale = 0
		o.BScales = b.g.Const("b_scale", core.F32, core.Shape{bs[0]},
			core.EncodeF32(b.uniform(bs[0], 0.25/127, 1.0/127)))
	}
	return o
}

func shadowCases() []testCase {
	type sc struct {
		name  string
		x     core.Shape // [M, K] or [K]
		xdt   core.DType
		wdt   core.DType
		C, N  int64 // C = 0: no ids (C = K)
		t     float32
		dupes bool
	}
	variants := []sc{
		{"no_outliers", core.Shape{4, 64}, core.F32, core.F32, 0, 24, 2, false},
		{"sparse", core.Shape{4, 64}, core.F32, core.F32, 0, 24, 0.9, false},
		{"dense", core.Shape{3, 37}, core.F32, core.F32, 0, 19, 0.05, false},
		{"ids_subset", core.Shape{5, 96}, core.F32, core.F32, 12, 33, 0.5, false},
		{"duplicates", core.Shape{2, 16}, core.F32, core.F32, 6, 9, 0.3, true},
		{"rank1", core.Shape{64}, core.F32, core.F32, 0, 17, 0.7, false},
		{"rank1_ids", core.Shape{64}, core.F32, core.F16, 10, 17, 0.5, false},
		{"f16_wt", core.Shape{3, 48}, core.F32, core.F16, 0, 40, 0.6, false},
		{"f16_x", core.Shape{3, 48}, core.F16, core.F16, 0, 40, 0.6, false},
		{"f16_x_f32_wt", core.Shape{3, 48}, core.F16, core.F32, 8, 40, 0.4, false},
		{"large", core.Shape{2, 2048}, core.F32, core.F32, 256, 2048, 0.99, false},
		{"m0", core.Shape{0, 16}, core.F32, core.F32, 0, 5, 0.5, false},
	}
	var cs []testCase
	for _, v := range variants {
		label := v.xdt.String() + "/" + v.wdt.String()
		cs = append(cs, graphCase(2, "SHADOW_MATMUL", label,
			caseName("SHADOW_MATMUL", "case", v.name, "x", v.xdt, "wt", v.wdt, "x_shape", v.x, "C", v.C, "N", v.N, "t", v.t),
			graphSpec{build: func(b *builder) {
				K := v.x[len(v.x)-1]
				x := b.in("x", v.xdt, v.x, -1, 1)
				C := v.C
				var ids *core.Tensor
				if C == 0 {
					C = K
				} else {
					idv := make([]int32, C)
					for i := range idv {
						idv[i] = int32(b.r.IntN(int(K)))
						if v.dupes && i%2 == 1 {
							idv[i] = idv[i-1]
						}
					}
					ids = b.inData("ids", core.I32, core.Shape{C}, core.EncodeI32(idv))
				}
				wt := b.in("wt", v.wdt, core.Shape{C, v.N}, -1, 1)
				b.g.Output(b.g.ShadowMatMul(x, wt, ids, v.t))
			}}))
	}
	nan := float32(math.NaN())
	cs = append(cs, graphCase(2, "SHADOW_MATMUL", "f32/f32",
		caseName("SHADOW_MATMUL", "case", "nan"),
		graphSpec{build: func(b *builder) {
			x := b.inData("x", core.F32, core.Shape{2, 8}, core.EncodeF32([]float32{
				0.1, nan, 0.2, 3, -0.1, 0, 0, 0,
				0.5, 0.25, -2, 0.1, 0, 0, 0.9, -0.2}))
			b.g.Output(b.g.ShadowMatMul(x, b.in("wt", core.F32, core.Shape{8, 5}, -1, 1), nil, 0.5))
		}}))
	cs = append(cs, graphCase(2, "SHADOW_MATMUL", "f32/f32",
		caseName("SHADOW_MATMUL", "case", "bad_id"),
		graphSpec{expectErr: core.ErrInvalidArgument, build: func(b *builder) {
			ids := b.inData("ids", core.I32, core.Shape{3}, core.EncodeI32([]int32{1, 16, 2}))
			x := b.in("x", core.F32, core.Shape{2, 16}, -1, 1)
			b.g.Output(b.g.ShadowMatMul(x, b.in("wt", core.F32, core.Shape{3, 4}, -1, 1), ids, 0.5))
		}}))
	return cs
}

// w8a8LinearCases are OPS.md's typical W8A8 lowering of a linear layer:
// QUANTIZE(x → I8, sa), MATMUL(qx, W_i8 per channel) and SHADOW_MATMUL(x, Wt, ids, 127·sa) for what
// the clip cut off, added. x has a few large channels, as LLM activations do.
func w8a8LinearCases() []testCase {
	var cs []testCase
	for _, v := range []struct {
		M, K, N, C   int64
		grid, shadow bool
	}{{1, 64, 48, 4, false, true}, {1, 256, 96, 8, true, true}, {7, 128, 33, 6, true, true}, {4, 96, 40, 0, false, true},
		// the NPU half alone (what a backend without SHADOW_MATMUL runs): the clipped product
		{1, 256, 96, 0, true, false}, {7, 128, 33, 0, true, false}} {
		cs = append(cs, graphCase(4, "GRAPH:w8a8-linear", "i8",
			caseName("GRAPH", "name", "w8a8-linear", "M", v.M, "K", v.K, "N", v.N, "C", v.C, "grid", v.grid, "shadow", v.shadow),
			graphSpec{build: func(b *builder) { w8a8Linear(b, v.M, v.K, v.N, v.C, v.grid, v.shadow) }}))
	}
	return cs
}

func w8a8Linear(b *builder, M, K, N, C int64, grid, shadow bool) {
	const sa = 1.0 / 127 // clip at 1: the bulk of x lies within ±1, the outlier channels far beyond
	xs := b.uniform(M*K, -1, 1)
	outlierCh := []int64{3, K / 2, K - 1}
	for m := int64(0); m < M; m++ {
		for i, c := range outlierCh {
			xs[m*K+c] = float32(4+3*i) * float32(1-2*(m%2))
		}
	}
	x := b.inData("x", core.F32, core.Shape{M, K}, core.EncodeF32(xs))
	w := b.uniform(N*K, -1, 1)
	scales := make([]float32, N)
	codes := make([]float32, N*K)
	for n := int64(0); n < N; n++ {
		amax := float32(0)
		for k := int64(0); k < K; k++ {
			amax = max(amax, float32(math.Abs(float64(w[n*K+k]))))
		}
		scales[n] = amax / 127
		for k := int64(0); k < K; k++ {
			codes[n*K+k] = float32(math.Round(float64(w[n*K+k] / scales[n])))
		}
	}
	qw := b.g.Const("w_i8", core.I8, core.Shape{N, K}, b.encode(core.I8, codes))
	o := core.W8A8Options{AScale: sa, BScales: b.g.Const("w_scale", core.F32, core.Shape{N}, core.EncodeF32(scales))}
	if grid {
		o.OutScale = 64.0 / 32767 // |y| stays far below 64 here
	}
	y := b.g.MatMulW8A8(b.g.Quantize(x, core.I8, sa), qw, o)
	if !shadow {
		b.g.Output(y)
		return
	}
	// The shadow weights: columns of the float weight for the kept channels (all when C = 0).
	ids := outlierCh
	if C == 0 {
		ids = make([]int64, K)
		for k := range ids {
			ids[k] = int64(k)
		}
	} else {
		for int64(len(ids)) < C {
			ids = append(ids, int64(b.r.IntN(int(K))))
		}
	}
	wt := make([]float32, 0, int64(len(ids))*N)
	for _, c := range ids {
		for n := int64(0); n < N; n++ {
			wt = append(wt, w[n*K+c])
		}
	}
	wtT := b.g.Const("wt", core.F32, core.Shape{int64(len(ids)), N}, core.EncodeF32(wt))
	var idT *core.Tensor
	if C != 0 {
		id32 := make([]int32, len(ids))
		for i, c := range ids {
			id32[i] = int32(c)
		}
		idT = b.g.Const("ids", core.I32, core.Shape{int64(len(ids))}, core.EncodeI32(id32))
	}
	b.g.Output(b.g.Add(y, b.g.ShadowMatMul(x, wtT, idT, 127*sa)))
}
