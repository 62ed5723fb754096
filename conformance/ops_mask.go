package conformance

import (
	"context"
	"math"
	"math/rand/v2"

	"github.com/xpuhub/xpu/core"
)

// ATTENTION with a tree mask (op set v2): a draft token tree of Tq tokens verified in one pass
// against a KV cache whose rows past q_offset+Tq are NaN for the backend (they must never be
// read) and zero for the reference.

// maskKind names how a case's [Tq,Tq] mask is drawn.
type maskKind string

const (
	maskChain     maskKind = "chain"      // lower triangle: plain causal attention
	maskStar      maskKind = "star"       // every token a child of token 0
	maskBinary    maskKind = "binary"     // a complete binary tree in breadth-first order
	maskTree      maskKind = "tree"       // random parents, topologically ordered
	maskRandom    maskKind = "random"     // arbitrary bits: not a tree, empty rows included
	maskEmptyRows maskKind = "empty-rows" // a random tree with every third row cleared
)

func drawMask(kind maskKind, T int, r *rand.Rand) []byte {
	parents := make([]int, T)
	for i := range parents {
		switch kind {
		case maskChain:
			parents[i] = i - 1
		case maskStar:
			parents[i] = min(i, 1) - 1 // -1 for token 0, then 0
		case maskBinary:
			parents[i] = (i+1)/2 - 1
		default:
			parents[i] = r.IntN(i+1) - 1
		}
	}
	m := core.TreeMask(parents)
	switch kind {
	case maskRandom:
		for i := range m {
			m[i] = byte(int8(r.IntN(3) - 1)) // -1 counts as visible: any non-zero byte does
		}
	case maskEmptyRows:
		for i := 0; i < T; i += 3 {
			clear(m[i*T : (i+1)*T])
		}
	}
	return m
}

func attentionMaskCases() []testCase {
	type mc struct {
		tq, hq, hkv, d, dv, off int64
		extra                   int64 // cache rows past q_offset+Tq (NaN); negative: the block overruns the cache
		kind                    maskKind
	}
	variants := []mc{
		{1, 2, 1, 16, 16, 0, 3, maskChain},
		{1, 4, 2, 32, 32, 7, 2, maskEmptyRows}, // a single query that sees only the prefix
		{1, 16, 4, 64, 64, 45, 3, maskChain},   // a decode row over two key windows, head groups of 4
		{4, 4, 4, 32, 32, 0, 2, maskStar},
		{5, 8, 2, 64, 64, 9, 3, maskTree},
		{8, 2, 1, 33, 17, 0, 1, maskBinary},
		{6, 2, 1, 8, 8, 0, 2, maskEmptyRows}, // rows that see nothing at all give 0
		{16, 8, 2, 64, 64, 40, 4, maskTree},
		{17, 4, 1, 16, 24, 3, 5, maskRandom},
		{33, 4, 2, 32, 32, 35, 0, maskTree}, // more than one 32-key block inside the tree
		{64, 8, 2, 64, 64, 100, 3, maskTree},
		{64, 2, 2, 16, 16, 0, 1, maskChain},
		{4, 2, 1, 16, 16, 6, -2, maskBinary}, // the last two tree keys lie past the cache
	}
	var cs []testCase
	// mixed dtypes on one representative shape
	forAttentionDTypes(variants, func(v mc) bool { return v.tq == 5 }, func(qdt, kvdt core.DType, v mc) {
		name := caseName("ATTENTION", "q", qdt, "kv", kvdt, "tq", v.tq, "hq", v.hq, "hkv", v.hkv,
			"d", v.d, "dv", v.dv, "offset", v.off, "extra_rows", v.extra, "mask", v.kind)
		cs = append(cs, testCase{name: name, level: 2, op: "ATTENTION", dtype: qdt.String() + "/" + kvdt.String(),
			run: func(r *runner, ctx context.Context, res *CaseResult) {
				r.maskedAttention(ctx, res, qdt, kvdt, v.tq, v.hq, v.hkv, v.d, v.dv, v.off, v.extra, v.kind)
			}})
	})
	return cs
}

// forAttentionDTypes calls f for each variant with each pair of float q and KV dtypes; a pair of
// two dtypes only on the variants representative picks, since it runs the same kernels at
// every shape.
func forAttentionDTypes[V any](variants []V, representative func(V) bool, f func(qdt, kvdt core.DType, v V)) {
	for _, qdt := range floatDTypes {
		for _, kvdt := range floatDTypes {
			for _, v := range variants {
				if qdt == kvdt || representative(v) {
					f(qdt, kvdt, v)
				}
			}
		}
	}
}

// maskedAttention runs one tree-mask case: the backend's cache holds NaN past q_offset+Tq.
func (r *runner) maskedAttention(ctx context.Context, res *CaseResult, qdt, kvdt core.DType,
	tq, hq, hkv, d, dv, off, extra int64, kind maskKind) {
	tk := off + tq + extra
	valid := min(tk, off+tq)
	var kVals, vVals []float32
	var mask []byte
	p := r.prepare(ctx, res, func(b *builder) {
		q := b.in("q", qdt, core.Shape{tq, hq, d}, -1, 1)
		kVals, vVals = b.uniform(tk*hkv*d, -1, 1), b.uniform(tk*hkv*dv, -1, 1)
		k := b.inData("k_cache", kvdt, core.Shape{tk, hkv, d}, nil)
		vc := b.inData("v_cache", kvdt, core.Shape{tk, hkv, dv}, nil)
		qo := b.inData("q_offset", core.I32, core.Shape{1}, core.EncodeI32([]int32{int32(off)}))
		mask = drawMask(kind, int(tq), b.r)
		m := b.inData("mask", core.I8, core.Shape{tq, tq}, mask)
		b.g.Output(b.g.Attention(q, k, vc, core.AttentionOptions{Causal: true, QOffsetInput: qo, Mask: m}))
	})
	if p == nil {
		return
	}
	defer closeAndRecord(res, "executable", p.exe)
	garbage := func(vals []float32, rowVals int64, fill float32) []byte {
		return cacheWithGarbage(kvdt, vals, valid*rowVals, fill)
	}
	nan := float32(math.NaN())
	in := p.inputs
	p.inputs = [][]byte{in[0], garbage(kVals, hkv*d, nan), garbage(vVals, hkv*dv, nan), in[3], in[4]}
	p.refInputs = [][]byte{in[0], garbage(kVals, hkv*d, 0), garbage(vVals, hkv*dv, 0), in[3], in[4]}
	r.verify(ctx, res, p)
}
