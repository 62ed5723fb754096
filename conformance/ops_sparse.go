package conformance

import (
	"github.com/xpuhub/xpu/core"
)

// Op set 3: SPARSE_FFN, PowerInfer-2's neuron-bundle FFN. Every bundle dtype, gated
// and ungated, the three activations, decode (M = 1, rank-1 x) and prefill-like M, empty slots
// (-1), duplicates, padded bundle rows, an all-empty idx, f16 x, a constant bundle table, and
// an index outside [-1, S).

type sparseCase struct {
	name    string
	xdt     core.DType
	x       core.Shape // [M, D] or [D]
	S, pad  int64      // bundle rows; values past the last segment
	Kn      int64      // idx slots
	fill    float64    // fraction of slots listed (the rest -1)
	dupes   bool       // every 4th listed slot repeats the one before
	ungated bool
	act     core.SparseAct
	konst   bool // bundles a constant rather than an input (the runtime passes an input)
}

// sparseIdx draws Kn slots: a fraction fill of them list a neuron in [0, S), the rest are -1.
func sparseIdx(b *builder, v sparseCase) []int32 {
	idx := make([]int32, v.Kn)
	for i := range idx {
		idx[i] = -1
		if b.r.Float64() < v.fill {
			idx[i] = int32(b.r.IntN(int(v.S)))
			if v.dupes && i%4 == 3 && idx[i-1] >= 0 {
				idx[i] = idx[i-1]
			}
		}
	}
	return idx
}

func sparseGraph(b *builder, v sparseCase, bdt core.DType, idx []int32) {
	D := v.x[len(v.x)-1]
	seg := int64(3)
	if v.ungated {
		seg = 2
	}
	bs := core.Shape{v.S, seg*D + v.pad}
	x := b.in("x", v.xdt, v.x, -1, 1)
	var bundles *core.Tensor
	if v.konst {
		bundles = b.cnst("bundles", bdt, bs, -1, 1)
	} else {
		bundles = b.in("bundles", bdt, bs, -1, 1)
	}
	ids := b.inData("idx", core.I32, core.Shape{int64(len(idx))}, core.EncodeI32(idx))
	b.g.Output(b.g.SparseFFN(x, bundles, ids, core.SparseFFNOptions{Act: v.act, Ungated: v.ungated}))
}

func sparseFFNCases() []testCase {
	acts := []struct {
		name string
		act  core.SparseAct
	}{{"relu", core.SparseReLU}, {"relu2", core.SparseReLU2}, {"silu", core.SparseSiLU}}
	var vs []sparseCase
	for _, a := range acts {
		for _, ungated := range []bool{false, true} {
			vs = append(vs,
				sparseCase{name: "small", xdt: core.F32, x: core.Shape{3, 64}, S: 40, pad: 32, Kn: 24, fill: 0.7, dupes: true, ungated: ungated, act: a.act},
				sparseCase{name: "decode", xdt: core.F32, x: core.Shape{1, 256}, S: 300, Kn: 96, fill: 0.5, ungated: ungated, act: a.act})
		}
	}
	vs = append(vs,
		sparseCase{name: "rank1", xdt: core.F32, x: core.Shape{128}, S: 50, pad: 64, Kn: 30, fill: 0.8, dupes: true},
		sparseCase{name: "prefill", xdt: core.F32, x: core.Shape{17, 128}, S: 64, pad: 32, Kn: 48, fill: 0.9, dupes: true},
		sparseCase{name: "prefill_silu", xdt: core.F32, x: core.Shape{9, 96}, S: 30, Kn: 20, fill: 1, act: core.SparseSiLU, ungated: true},
		sparseCase{name: "pad_over_3d", xdt: core.F32, x: core.Shape{2, 32}, S: 12, pad: 128, Kn: 10, fill: 0.8},
		sparseCase{name: "all_empty", xdt: core.F32, x: core.Shape{2, 64}, S: 8, Kn: 16, fill: 0},
		sparseCase{name: "no_slots", xdt: core.F32, x: core.Shape{2, 64}, S: 8, Kn: 0},
		sparseCase{name: "m0", xdt: core.F32, x: core.Shape{0, 64}, S: 8, Kn: 4, fill: 1},
		sparseCase{name: "f16_x", xdt: core.F16, x: core.Shape{4, 64}, S: 20, pad: 32, Kn: 16, fill: 0.8, dupes: true},
		sparseCase{name: "f16_x_rank1_silu", xdt: core.F16, x: core.Shape{96}, S: 20, Kn: 16, fill: 0.8, act: core.SparseSiLU},
		sparseCase{name: "const_bundles", xdt: core.F32, x: core.Shape{2, 64}, S: 16, Kn: 12, fill: 0.8, konst: true},
	)
	var cs []testCase
	add := func(v sparseCase, bdt core.DType) {
		cs = append(cs, graphCase(2, "SPARSE_FFN", v.xdt.String()+"/"+bdt.String(),
			caseName("SPARSE_FFN", "case", v.name, "x", v.xdt, "bundles", bdt, "x_shape", v.x, "S", v.S, "pad", v.pad,
				"K", v.Kn, "ungated", v.ungated, "act", int(v.act)),
			graphSpec{build: func(b *builder) { sparseGraph(b, v, bdt, sparseIdx(b, v)) }}))
	}
	for _, bdt := range []core.DType{core.F32, core.F16, core.Q8_0, core.Q4_0} {
		for _, v := range vs {
			add(v, bdt)
		}
	}
	// Float bundles take any D: odd sizes leave a tail past the SIMD width.
	for _, bdt := range floatDTypes {
		add(sparseCase{name: "odd_d", xdt: core.F32, x: core.Shape{3, 37}, S: 9, pad: 5, Kn: 11, fill: 0.8, dupes: true}, bdt)
		add(sparseCase{name: "odd_d_ungated", xdt: core.F32, x: core.Shape{1, 19}, S: 9, Kn: 7, fill: 1, ungated: true, act: core.SparseReLU2}, bdt)
	}
	for _, bad := range []int32{-2, 40} {
		cs = append(cs, graphCase(2, "SPARSE_FFN", "f32/q4_0",
			caseName("SPARSE_FFN", "case", "bad_idx", "id", bad),
			graphSpec{expectErr: core.ErrInvalidArgument, build: func(b *builder) {
				sparseGraph(b, sparseCase{xdt: core.F32, x: core.Shape{2, 64}, S: 40}, core.Q4_0, []int32{3, -1, bad, 0})
			}}))
	}
	return cs
}
