package conformance

import (
	"math"

	"github.com/xpuhub/xpu/core"
)

// specialF32 are values that conversions must get exactly right: signed zeros, infinities,
// NaN, f16's limits (65504, 65520 rounds to Inf), subnormals of f16 and bf16, and ties.
var specialF32 = []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
	float32(math.NaN()), 65504, 65520, -70000, 6e-8, 3e-8, 1e-40, 1 + 1.0/2048, 1 + 3.0/2048, 1e38}

func conversionCases() []testCase {
	var cs []testCase
	floats := []core.DType{core.F32, core.F16, core.BF16}
	for _, from := range append(floats, core.I32) {
		for _, to := range floats {
			for _, sh := range []core.Shape{{1}, {37}, {3, 65}, {0}} {
				cs = append(cs, graphCase(2, "CAST", from.String()+">"+to.String(),
					caseName("CAST", "from", from, "to", to, "shape", sh),
					graphSpec{build: func(b *builder) {
						b.g.Output(b.g.Cast(b.inData("x", from, sh, castInput(b, from, sh)), to))
					}}))
			}
		}
	}
	for _, dt := range append([]core.DType{core.Q8_0, core.Q4_0, core.I8}, kQuants...) {
		shapes := []core.Shape{{1, 32}, {3, 64}, {5, 96}, {2, 2, 256}, {0, 32}}
		if dt.KQuant() {
			shapes = []core.Shape{{1, 256}, {3, 512}, {2, 2, 256}, {0, 256}}
		}
		for _, sh := range shapes {
			cs = append(cs, graphCase(2, "QUANTIZE", dt.String(), caseName("QUANTIZE", "to", dt, "shape", sh),
				graphSpec{build: func(b *builder) {
					b.g.Output(b.g.Quantize(b.in("x", core.F32, sh, -1, 1), dt, 1.0/127))
				}}))
			cs = append(cs, graphCase(2, "DEQUANTIZE", dt.String(), caseName("DEQUANTIZE", "from", dt, "shape", sh),
				graphSpec{build: func(b *builder) {
					b.g.Output(b.g.Dequantize(b.in("x", dt, sh, -1, 1), 0.01))
				}}))
		}
	}
	return cs
}

// kQuants are the op set v2 K-quant dtypes, in the order OPS.md lists them.
var kQuants = []core.DType{core.Q4_K, core.Q5_K, core.Q6_K, core.Q2_K, core.Q3_K}

// castInput is random values with the special ones mixed in (for float sources).
func castInput(b *builder, dt core.DType, sh core.Shape) []byte {
	n := sh.NumElements()
	if dt == core.I32 {
		return b.randomData(dt, sh, -70000, 70000)
	}
	xs := b.uniform(n, -3, 3)
	for i := range xs {
		if b.r.IntN(4) == 0 {
			xs[i] = specialF32[b.r.IntN(len(specialF32))]
		}
	}
	return b.encode(dt, xs)
}

func movementCases() []testCase {
	dts := []core.DType{core.F32, core.F16, core.BF16, core.I32, core.I8}
	var cs []testCase
	for _, dt := range dts {
		for _, r := range []struct{ from, to core.Shape }{
			{core.Shape{2, 3, 4}, core.Shape{6, 4}}, {core.Shape{24}, core.Shape{2, 3, 4}},
			{core.Shape{7}, core.Shape{1, 7, 1}}, {core.Shape{0, 3}, core.Shape{3, 0}},
		} {
			cs = append(cs, graphCase(2, "RESHAPE", dt.String(),
				caseName("RESHAPE", "dtype", dt, "from", r.from, "to", r.to),
				graphSpec{build: func(b *builder) {
					// a node before the reshape, so a backend cannot answer with the input buffer
					x := b.g.Reshape(b.in("x", dt, r.from, -1, 1), r.to...)
					b.g.Output(b.g.Reshape(x, r.to...))
				}}))
		}
		for _, p := range []struct {
			shape core.Shape
			perm  []int64
		}{
			{core.Shape{2, 3}, []int64{1, 0}}, {core.Shape{17, 33}, []int64{1, 0}}, {core.Shape{1, 5}, []int64{1, 0}},
			{core.Shape{2, 3, 4}, []int64{2, 0, 1}}, {core.Shape{2, 3, 4, 5}, []int64{0, 2, 1, 3}},
			{core.Shape{3, 4, 5, 6}, []int64{3, 2, 1, 0}}, {core.Shape{0, 4}, []int64{1, 0}},
		} {
			cs = append(cs, graphCase(2, "PERMUTE", dt.String(),
				caseName("PERMUTE", "dtype", dt, "shape", p.shape, "perm", core.Shape(p.perm)),
				graphSpec{build: func(b *builder) {
					b.g.Output(b.g.Permute(b.in("x", dt, p.shape, -1, 1), p.perm...))
				}}))
		}
		for _, s := range []struct {
			shape         core.Shape
			axis          int
			start, length int64
		}{
			{core.Shape{5, 7}, 0, 1, 3}, {core.Shape{5, 7}, 1, 2, 5}, {core.Shape{2, 3, 9}, 2, 4, 0},
			{core.Shape{4, 4, 4, 4}, 1, 3, 1}, {core.Shape{33}, 0, 0, 33},
		} {
			cs = append(cs, graphCase(2, "SLICE", dt.String(),
				caseName("SLICE", "dtype", dt, "shape", s.shape, "axis", s.axis, "start", s.start, "len", s.length),
				graphSpec{build: func(b *builder) {
					b.g.Output(b.g.Slice(b.in("x", dt, s.shape, -1, 1), s.axis, s.start, s.length))
				}}))
		}
		for _, c := range []struct {
			axis   int
			shapes []core.Shape
		}{
			{0, []core.Shape{{2, 3}, {4, 3}}}, {1, []core.Shape{{3, 5}, {3, 2}}},
			{2, []core.Shape{{2, 2, 1}, {2, 2, 7}, {2, 2, 3}}}, {1, []core.Shape{{2, 0}, {2, 3}}},
			{0, []core.Shape{{1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}}},
		} {
			cs = append(cs, graphCase(2, "CONCAT", dt.String(),
				caseName("CONCAT", "dtype", dt, "axis", c.axis, "inputs", len(c.shapes), "first", c.shapes[0]),
				graphSpec{build: func(b *builder) {
					xs := make([]*core.Tensor, len(c.shapes))
					for i, sh := range c.shapes {
						xs[i] = b.in("x", dt, sh, -1, 1)
					}
					b.g.Output(b.g.Concat(c.axis, xs...))
				}}))
		}
	}
	return cs
}
