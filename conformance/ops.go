package conformance

import (
	"fmt"
	"slices"
	"strings"

	"github.com/xpuhub/xpu/core"
)

// Level 2: every v1 op × the dtypes it takes × the shapes that break kernels: 1, odd sizes,
// sizes that are not a multiple of a SIMD width (4, 8, 16) or of a block (32), a large case
// that still runs fast, broadcast forms, and zero-size where OPS.md allows it.

var floatDTypes = []core.DType{core.F32, core.F16}

func shapeStr(s core.Shape) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func caseName(op string, kv ...any) string {
	var parts []string
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		if s, ok := v.(core.Shape); ok {
			v = shapeStr(s)
		}
		parts = append(parts, fmt.Sprintf("%v=%v", kv[i], v))
	}
	return op + "(" + strings.Join(parts, ",") + ")"
}

func opCases() []testCase {
	return slices.Concat(unaryCases(), binaryCases(), normCases(), softmaxCases(), matmulCases(), ropeCases(),
		attentionCases(), attentionMaskCases(), getRowsCases(), conversionCases(), movementCases(), w8a8Cases(),
		sparseFFNCases(), v5Cases())
}

var unaryShapes = []core.Shape{{}, {1}, {7}, {17}, {3, 33}, {2, 3, 5, 67}, {4, 1031}, {0}, {3, 0, 5}}

func unaryCases() []testCase {
	type unary struct {
		op     core.Op
		lo, hi float32
		apply  func(g *core.Graph, x *core.Tensor) *core.Tensor
	}
	ops := []unary{
		{core.OpSiLU, -10, 10, (*core.Graph).SiLU},
		{core.OpGELU, -6, 6, (*core.Graph).GELU},
		{core.OpReLU, -1, 1, (*core.Graph).ReLU},
		{core.OpExp, -5, 5, (*core.Graph).Exp},
		{core.OpNeg, -1, 1, (*core.Graph).Neg},
		{core.OpScale, -1, 1, func(g *core.Graph, x *core.Tensor) *core.Tensor { return g.Scale(x, 0.75, -0.25) }},
	}
	var cs []testCase
	for _, u := range ops {
		for _, dt := range floatDTypes {
			for _, sh := range unaryShapes {
				cs = append(cs, graphCase(2, u.op.String(), dt.String(),
					caseName(u.op.String(), "dtype", dt, "shape", sh),
					graphSpec{build: func(b *builder) {
						b.g.Output(u.apply(b.g, b.in("x", dt, sh, u.lo, u.hi)))
					}}))
			}
		}
	}
	// wide inputs: exp overflows to +Inf and SiLU's exp(-x) saturates, in f32
	cs = append(cs,
		graphCase(2, "EXP", "f32", caseName("EXP", "dtype", "f32", "shape", core.Shape{257}, "range", 100),
			graphSpec{build: func(b *builder) { b.g.Output(b.g.Exp(b.in("x", core.F32, core.Shape{257}, -100, 100))) }}),
		graphCase(2, "SILU", "f32", caseName("SILU", "dtype", "f32", "shape", core.Shape{257}, "range", 100),
			graphSpec{build: func(b *builder) { b.g.Output(b.g.SiLU(b.in("x", core.F32, core.Shape{257}, -100, 100))) }}),
	)
	return cs
}

func binaryCases() []testCase {
	type pair struct{ a, b core.Shape }
	pairs := []pair{
		{core.Shape{1}, core.Shape{1}}, {core.Shape{7}, core.Shape{7}}, {core.Shape{3, 33}, core.Shape{3, 33}},
		{core.Shape{65, 130}, core.Shape{65, 130}},
		{core.Shape{3, 33}, core.Shape{33}}, {core.Shape{3, 33}, core.Shape{3, 1}}, {core.Shape{1}, core.Shape{2, 17}},
		{core.Shape{2, 1, 5}, core.Shape{3, 1}}, {core.Shape{4, 1, 1, 9}, core.Shape{1, 5, 7, 1}},
		{core.Shape{0, 5}, core.Shape{5}}, {core.Shape{}, core.Shape{3}},
	}
	ops := []struct {
		op    core.Op
		apply func(g *core.Graph, a, b *core.Tensor) *core.Tensor
	}{{core.OpAdd, (*core.Graph).Add}, {core.OpSub, (*core.Graph).Sub}, {core.OpMul, (*core.Graph).Mul},
		{core.OpDiv, (*core.Graph).Div}}
	var cs []testCase
	for _, o := range ops {
		for _, dt := range floatDTypes {
			for _, p := range pairs {
				cs = append(cs, graphCase(2, o.op.String(), dt.String(),
					caseName(o.op.String(), "dtype", dt, "a", p.a, "b", p.b),
					graphSpec{build: func(b *builder) {
						x := b.in("a", dt, p.a, -1, 1)
						var y *core.Tensor
						if o.op == core.OpDiv {
							// |b| in [0.5, 1.5] with a random sign: a quotient, not a pole
							n := p.b.NumElements()
							v := b.uniform(n, 0.5, 1.5)
							for i := range v {
								if b.r.IntN(2) == 0 {
									v[i] = -v[i]
								}
							}
							y = b.inData("b", dt, p.b, b.encode(dt, v))
						} else {
							y = b.in("b", dt, p.b, -1, 1)
						}
						b.g.Output(o.apply(b.g, x, y))
					}}))
			}
		}
	}
	return cs
}

func normCases() []testCase {
	shapes := []core.Shape{{1, 1}, {3, 17}, {5, 256}, {2, 3, 4097}, {0, 8}, {9}}
	var cs []testCase
	norms := []struct {
		op    core.Op
		apply func(g *core.Graph, x *core.Tensor, eps float32) *core.Tensor
	}{{core.OpRMSNorm, (*core.Graph).RMSNorm}, {core.OpLayerNorm, (*core.Graph).LayerNorm}}
	for _, n := range norms {
		for _, dt := range floatDTypes {
			for _, sh := range shapes {
				for _, eps := range []float32{1e-5, 1e-6} {
					if eps == 1e-6 && sh.NumElements() != 3*17 {
						continue // one shape checks that eps is read
					}
					cs = append(cs, graphCase(2, n.op.String(), dt.String(),
						caseName(n.op.String(), "dtype", dt, "shape", sh, "eps", eps),
						graphSpec{build: func(b *builder) {
							// an offset mean, so LAYER_NORM's centring matters
							b.g.Output(n.apply(b.g, b.in("x", dt, sh, -2, 3), eps))
						}}))
				}
			}
		}
	}
	return cs
}

func softmaxCases() []testCase {
	type sm struct {
		shape  core.Shape
		scale  float32
		causal bool
		offset int64
		lo, hi float32
	}
	variants := []sm{
		{core.Shape{1, 1}, 0, false, 0, -1, 1}, {core.Shape{3, 17}, 0, false, 0, -4, 4},
		{core.Shape{4, 1000}, 0.125, false, 0, -8, 8}, {core.Shape{2, 3, 33}, 2, false, 0, -60, 60},
		{core.Shape{7}, 1, false, 0, -1, 1},
		{core.Shape{7, 7}, 0, true, 0, -3, 3}, {core.Shape{3, 10}, 0.5, true, 7, -3, 3},
		{core.Shape{2, 5, 9}, 0, true, 4, -3, 3}, {core.Shape{4, 6}, 0, true, -2, -3, 3},
		{core.Shape{0, 5}, 0, false, 0, -1, 1},
	}
	var cs []testCase
	for _, dt := range floatDTypes {
		for _, v := range variants {
			cs = append(cs, graphCase(2, "SOFTMAX", dt.String(),
				caseName("SOFTMAX", "dtype", dt, "shape", v.shape, "scale", v.scale, "causal", v.causal,
					"offset", v.offset),
				graphSpec{build: func(b *builder) {
					x := b.in("x", dt, v.shape, v.lo, v.hi)
					if v.causal {
						b.g.Output(b.g.CausalSoftmax(x, v.scale, v.offset))
					} else {
						b.g.Output(b.g.Softmax(x, v.scale))
					}
				}}))
		}
	}
	return cs
}

func matmulCases() []testCase {
	type mm struct {
		a, b   core.Shape
		const_ bool // b is a constant (a weight) rather than a graph input
	}
	float := []mm{
		{core.Shape{1, 1}, core.Shape{1, 1}, false}, {core.Shape{5, 7}, core.Shape{3, 7}, false},
		{core.Shape{16, 33}, core.Shape{17, 33}, true}, {core.Shape{1, 256}, core.Shape{64, 256}, true},
		{core.Shape{64, 512}, core.Shape{256, 512}, true}, {core.Shape{9}, core.Shape{5, 9}, true},
		{core.Shape{2, 3, 5, 33}, core.Shape{3, 17, 33}, false}, {core.Shape{2, 4, 9}, core.Shape{7, 9}, true},
		{core.Shape{2, 1, 4, 8}, core.Shape{1, 3, 6, 8}, false},
		{core.Shape{0, 32}, core.Shape{16, 32}, true}, {core.Shape{4, 32}, core.Shape{0, 32}, false},
		// 2 and 3 rows on a constant weight: a verify of 1-2 draft tokens (neon: packed panels;
		// a partial last panel, and K across two cache blocks)
		{core.Shape{2, 40}, core.Shape{21, 40}, true}, {core.Shape{3, 300}, core.Shape{35, 300}, true},
	}
	quant := []mm{
		{core.Shape{1, 32}, core.Shape{1, 32}, true}, {core.Shape{5, 96}, core.Shape{17, 96}, true},
		{core.Shape{16, 256}, core.Shape{64, 256}, true}, {core.Shape{3, 64}, core.Shape{33, 64}, false},
		{core.Shape{2, 7, 128}, core.Shape{9, 128}, true}, {core.Shape{64}, core.Shape{8, 64}, true},
		{core.Shape{0, 32}, core.Shape{4, 32}, true},
		// 8 rows on a constant weight: a decode step of 8 batched sequences (neon: one 8-row kernel
		// call per group, a partial last group)
		{core.Shape{8, 96}, core.Shape{33, 96}, true},
	}
	// K-quant weights: K a multiple of 256; GEMV (M = 1, decode) and GEMM (prefill) shapes.
	kquant := []mm{
		{core.Shape{1, 256}, core.Shape{4, 256}, true}, {core.Shape{1, 512}, core.Shape{33, 512}, true},
		{core.Shape{5, 256}, core.Shape{17, 256}, true}, {core.Shape{16, 512}, core.Shape{64, 512}, true},
		{core.Shape{3, 256}, core.Shape{5, 256}, false}, {core.Shape{2, 3, 256}, core.Shape{9, 256}, true},
		{core.Shape{256}, core.Shape{8, 256}, true}, {core.Shape{0, 256}, core.Shape{4, 256}, true},
		{core.Shape{8, 256}, core.Shape{17, 256}, true},
	}
	var cs []testCase
	for _, adt := range floatDTypes {
		for _, bdt := range append([]core.DType{core.F32, core.F16, core.BF16, core.Q8_0, core.Q4_0, core.I8}, kQuants...) {
			shapes := float
			switch {
			case bdt.KQuant():
				shapes = kquant
			case bdt.Quantized() || bdt == core.I8:
				shapes = quant
			}
			for _, s := range shapes {
				if adt == core.F16 && s.a.NumElements() > 4096 {
					continue // the large case once, in f32
				}
				label := adt.String() + "/" + bdt.String()
				cs = append(cs, graphCase(2, "MATMUL", label,
					caseName("MATMUL", "a", adt, "b", bdt, "a_shape", s.a, "b_shape", s.b, "b_const", s.const_),
					graphSpec{build: func(b *builder) {
						a := b.in("a", adt, s.a, -1, 1)
						var w *core.Tensor
						if s.const_ {
							w = b.cnst("b", bdt, s.b, -1, 1)
						} else {
							w = b.in("b", bdt, s.b, -1, 1)
						}
						if bdt == core.I8 {
							b.g.Output(b.g.MatMulI8(a, w, 1.0/127))
						} else {
							b.g.Output(b.g.MatMul(a, w))
						}
					}}))
			}
		}
	}
	return cs
}

func ropeCases() []testCase {
	type rc struct {
		shape core.Shape
		o     core.RoPEOptions
		maxP  int
	}
	variants := []rc{
		{core.Shape{1, 1, 2}, core.RoPEOptions{}, 8},
		{core.Shape{7, 3, 16}, core.RoPEOptions{}, 64},
		{core.Shape{7, 3, 16}, core.RoPEOptions{Mode: core.RoPENeoX}, 64},
		{core.Shape{5, 4, 64}, core.RoPEOptions{Dims: 32}, 4096},
		{core.Shape{5, 4, 64}, core.RoPEOptions{Mode: core.RoPENeoX, Dims: 32}, 4096},
		{core.Shape{3, 2, 9}, core.RoPEOptions{Dims: 8, Base: 1e6, FreqScale: 0.5}, 1000},
		{core.Shape{2, 3, 2, 10}, core.RoPEOptions{Mode: core.RoPENeoX, Dims: 6}, 100},
		{core.Shape{0, 2, 8}, core.RoPEOptions{}, 8},
	}
	var cs []testCase
	for _, dt := range floatDTypes {
		for _, v := range variants {
			mode := "normal"
			if v.o.Mode == core.RoPENeoX {
				mode = "neox"
			}
			cs = append(cs, graphCase(2, "ROPE", dt.String(),
				caseName("ROPE", "dtype", dt, "shape", v.shape, "mode", mode, "dims", v.o.Dims, "base",
					v.o.Base, "freq_scale", v.o.FreqScale),
				graphSpec{build: func(b *builder) {
					x := b.in("x", dt, v.shape, -1, 1)
					T := v.shape[len(v.shape)-3]
					pos := b.in("pos", core.I32, core.Shape{T}, 0, float32(v.maxP))
					b.g.Output(b.g.RoPE(x, pos, v.o))
				}}))
		}
	}
	return cs
}

func attentionCases() []testCase {
	type ac struct {
		tq, tk, hq, hkv, d, dv int64
		causal                 bool
		offset                 int64
		offsetInput            bool
		scale                  float32
		h0, nh                 int64 // a KV head range (op set 4): heads h0..h0+nh-1 of k and v; nh 0 = all
	}
	variants := []ac{
		{1, 1, 1, 1, 8, 8, false, 0, false, 0, 0, 0},
		{4, 9, 2, 2, 16, 16, false, 0, false, 0, 0, 0},
		{5, 5, 4, 4, 32, 32, true, 0, false, 0, 0, 0},
		{3, 17, 8, 2, 64, 64, true, 14, false, 0, 0, 0},
		{2, 11, 6, 3, 24, 40, true, 9, true, 0, 0, 0},
		{7, 7, 4, 1, 33, 17, true, 0, false, 0.3, 0, 0},
		{4, 6, 2, 1, 8, 8, true, -2, false, 0, 0, 0}, // the first queries see no key: all zero
		{0, 5, 2, 1, 8, 8, false, 0, false, 0, 0, 0},
		// a decode row of a GQA model: head groups of 4, several key windows, keys past the offset
		{1, 90, 32, 8, 64, 64, true, 70, true, 0, 0, 0},
		// one part of an attention split by heads: the query heads of a range of KV heads
		{1, 90, 16, 8, 64, 64, true, 70, true, 0, 4, 4}, // decode, the second half of the KV heads
		{5, 40, 8, 4, 64, 64, true, 30, true, 0, 0, 2},  // a chunk, the first half
		{3, 17, 3, 3, 8, 8, true, 14, false, 0, 1, 1},   // small heads, the middle KV head alone
		{2, 11, 4, 6, 24, 40, true, 9, true, 0, 3, 2},
	}
	var cs []testCase
	// mixed dtypes on one representative shape
	forAttentionDTypes(variants, func(v ac) bool { return v.tq == 3 }, func(qdt, kvdt core.DType, v ac) {
		cs = append(cs, graphCase(2, "ATTENTION", qdt.String()+"/"+kvdt.String(),
			caseName("ATTENTION", "q", qdt, "kv", kvdt, "tq", v.tq, "tk", v.tk, "hq", v.hq, "hkv", v.hkv,
				"d", v.d, "dv", v.dv, "causal", v.causal, "offset", v.offset, "offset_input", v.offsetInput,
				"scale", v.scale, "kv_heads", fmt.Sprintf("%d+%d", v.h0, v.nh)),
			graphSpec{build: func(b *builder) {
				q := b.in("q", qdt, core.Shape{v.tq, v.hq, v.d}, -1, 1)
				k := b.in("k", kvdt, core.Shape{v.tk, v.hkv, v.d}, -1, 1)
				val := b.in("v", kvdt, core.Shape{v.tk, v.hkv, v.dv}, -1, 1)
				o := core.AttentionOptions{Scale: v.scale, Causal: v.causal, QOffset: v.offset,
					KVHeadOffset: v.h0, KVHeads: v.nh}
				if v.offsetInput {
					o.QOffset = 0 // the input, not the attribute, must be read
					o.QOffsetInput = b.inData("q_offset", core.I32, core.Shape{1},
						core.EncodeI32([]int32{int32(v.offset)}))
				}
				b.g.Output(b.g.Attention(q, k, val, o))
			}}))
	})
	return cs
}

func getRowsCases() []testCase {
	type gr struct {
		table, ids core.Shape
	}
	variants := []gr{
		{core.Shape{10, 64}, core.Shape{5}}, {core.Shape{10, 64}, core.Shape{2, 3}}, {core.Shape{1, 32}, core.Shape{1}},
		{core.Shape{300, 96}, core.Shape{2, 2, 7}}, {core.Shape{10, 64}, core.Shape{0}},
		{core.Shape{50, 32}, core.Shape{70000}}, // more rows than a GPU grid dimension holds
	}
	kvariants := []gr{
		{core.Shape{10, 256}, core.Shape{5}}, {core.Shape{3, 512}, core.Shape{2, 3}}, {core.Shape{1, 256}, core.Shape{1}},
		{core.Shape{10, 256}, core.Shape{0}},
	}
	var cs []testCase
	for _, dt := range append([]core.DType{core.F32, core.F16, core.BF16, core.Q8_0, core.Q4_0, core.I8}, kQuants...) {
		vs := variants
		switch {
		case dt.KQuant():
			vs = kvariants
		case !dt.Quantized():
			vs = append(vs, gr{core.Shape{6, 7}, core.Shape{4}})
		}
		for _, v := range vs {
			cs = append(cs, graphCase(2, "GET_ROWS", dt.String(),
				caseName("GET_ROWS", "table", dt, "table_shape", v.table, "ids", v.ids),
				graphSpec{build: func(b *builder) {
					b.g.Output(getRows(b, dt, v.table, b.in("ids", core.I32, v.ids, 0, float32(v.table[0]))))
				}}))
		}
		// an id past the table's end, and a negative one
		for _, bad := range []struct {
			key string
			ids []int32
		}{{"bad_id", []int32{1, 10, 2}}, {"negative_id", []int32{1, -1, 2}}} {
			cs = append(cs, graphCase(2, "GET_ROWS", dt.String(),
				caseName("GET_ROWS", "table", dt, bad.key, true),
				graphSpec{expectErr: core.ErrInvalidArgument, build: func(b *builder) {
					ids := b.inData("ids", core.I32, core.Shape{3}, core.EncodeI32(bad.ids))
					k := int64(32)
					if dt.KQuant() {
						k = core.QKK
					}
					b.g.Output(getRows(b, dt, core.Shape{10, k}, ids))
				}}))
		}
	}
	return cs
}

func getRows(b *builder, dt core.DType, table core.Shape, ids *core.Tensor) *core.Tensor {
	t := b.cnst("table", dt, table, -1, 1)
	if dt == core.I8 {
		return b.g.GetRowsI8(t, ids, 0.02)
	}
	return b.g.GetRows(t, ids)
}
