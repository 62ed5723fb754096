package conformance

import (
	"context"
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
)

// Level 4: graphs. A Llama-style transformer block that reads and extends a KV cache, and
// chunked attention: query chunks of a fixed shape attending to a longer KV cache whose rows
// past the valid length hold NaN (OPS.md: masked keys are never read).

func graphCases() []testCase {
	var cs []testCase
	for _, v := range []struct {
		label   string
		act, wt core.DType
	}{{"f32", core.F32, core.F32}, {"f16", core.F16, core.F16}, {"q8_0", core.F32, core.Q8_0}, {"q4_0", core.F32, core.Q4_0},
		{"q4_k", core.F32, core.Q4_K}, {"q6_k", core.F32, core.Q6_K}} {
		cs = append(cs, graphCase(4, "GRAPH:transformer-block", v.label,
			caseName("GRAPH", "name", "transformer-block", "act", v.act, "weights", v.wt),
			graphSpec{build: func(b *builder) { transformerBlock(b, v.act, v.wt) }}))
	}
	for _, kv := range floatDTypes {
		cs = append(cs, testCase{name: caseName("GRAPH", "name", "chunked-attention", "kv", kv), level: 4,
			op: "GRAPH:chunked-attention", dtype: kv.String(),
			run: func(r *runner, ctx context.Context, res *CaseResult) { r.chunkedAttention(ctx, res, kv) }})
	}
	return append(cs, w8a8LinearCases()...)
}

// transformerBlock builds one pre-norm Llama block on T new tokens after P cached ones:
// RMSNorm, Q/K/V projections, RoPE, KV-cache concat, GQA causal attention, output projection,
// residual, RMSNorm, SwiGLU FFN, residual. Outputs: the block's output and the new K and V rows.
func transformerBlock(b *builder, act, wt core.DType) {
	var T, P, E, H, Hkv, D, FF int64 = 5, 7, 64, 4, 2, 16, 96
	if wt.KQuant() {
		E, D, FF = 256, 64, 256 // every matrix's input dimension a multiple of the 256 super-block
	}
	g := b.g
	ws := float32(1 / math.Sqrt(float64(E)))
	x := b.in("x", act, core.Shape{T, E}, -1, 1)
	posv := make([]int32, T)
	for i := range posv {
		posv[i] = int32(P + int64(i))
	}
	pos := b.inData("pos", core.I32, core.Shape{T}, core.EncodeI32(posv))
	kPast := b.in("k_cache", act, core.Shape{P, Hkv, D}, -1, 1)
	vPast := b.in("v_cache", act, core.Shape{P, Hkv, D}, -1, 1)
	w := func(name string, out, in int64) *core.Tensor {
		return b.cnst(name, wt, core.Shape{out, in}, -ws*1.7, ws*1.7)
	}
	norm := func(name string, t *core.Tensor) *core.Tensor {
		return g.Mul(g.RMSNorm(t, 1e-5), b.cnst(name, act, core.Shape{E}, 0.5, 1.5))
	}
	h := norm("attn_norm", x)
	q := g.RoPE(g.Reshape(g.MatMul(h, w("wq", H*D, E)), T, H, D), pos, core.RoPEOptions{})
	k := g.RoPE(g.Reshape(g.MatMul(h, w("wk", Hkv*D, E)), T, Hkv, D), pos, core.RoPEOptions{})
	v := g.Reshape(g.MatMul(h, w("wv", Hkv*D, E)), T, Hkv, D)
	kAll, vAll := g.Concat(0, kPast, k), g.Concat(0, vPast, v)
	a := g.Attention(q, kAll, vAll, core.AttentionOptions{Causal: true, QOffset: P})
	x2 := g.Add(x, g.MatMul(g.Reshape(a, T, H*D), w("wo", E, H*D)))
	h2 := norm("ffn_norm", x2)
	ff := g.Mul(g.SiLU(g.MatMul(h2, w("w_gate", FF, E))), g.MatMul(h2, w("w_up", FF, E)))
	y := g.Add(x2, g.MatMul(ff, w("w_down", E, FF)))
	// the new rows as their own outputs, the way a runtime appends them to its cache
	g.Output(y, g.Reshape(k, T, Hkv, D), g.Reshape(v, T, Hkv, D))
}

// cacheWithGarbage encodes a KV cache's values as kvdt with every value from index valid on
// replaced by garbage: NaN for the backend, which must not read them, and 0 for the reference.
func cacheWithGarbage(kvdt core.DType, vals []float32, valid int64, garbage float32) []byte {
	out := append([]float32(nil), vals...)
	for i := valid; i < int64(len(out)); i++ {
		out[i] = garbage
	}
	return newBuilder(nil).encode(kvdt, out)
}

// chunkedAttention prepares one graph for a query chunk of C rows against a KV cache of Cap
// rows with the offset as an input, and runs it for successive chunks; cache rows past
// offset+C are NaN for the backend and zero for the reference.
func (r *runner) chunkedAttention(ctx context.Context, res *CaseResult, kvdt core.DType) {
	const C, Cap, Hq, Hkv, D = 4, 32, 4, 2, 16
	rowVals := int64(Hkv * D)
	var kFull, vFull []float32
	p := r.prepare(ctx, res, func(b *builder) {
		q := b.in("q", core.F32, core.Shape{C, Hq, D}, -1, 1)
		kFull, vFull = b.uniform(Cap*rowVals, -1, 1), b.uniform(Cap*rowVals, -1, 1)
		k := b.inData("k_cache", kvdt, core.Shape{Cap, Hkv, D}, nil)
		v := b.inData("v_cache", kvdt, core.Shape{Cap, Hkv, D}, nil)
		off := b.inData("q_offset", core.I32, core.Shape{1}, nil)
		b.g.Output(b.g.Attention(q, k, v, core.AttentionOptions{Causal: true, QOffsetInput: off}))
	})
	if p == nil {
		return
	}
	defer closeAndRecord(res, "executable", p.exe)
	masked := func(vals []float32, valid int64, garbage float32) []byte {
		return cacheWithGarbage(kvdt, vals, valid*rowVals, garbage)
	}
	for chunk := range 3 {
		offset := int64(chunk * C)
		valid := offset + C
		qb := newBuilder(caseRand(fmt.Sprintf("%s/chunk%d", res.Name, chunk), r.cfg.seed))
		q := qb.randomData(core.F32, core.Shape{C, Hq, D}, -1, 1)
		offBytes := core.EncodeI32([]int32{int32(offset)})
		nan := float32(math.NaN())
		p.inputs = [][]byte{q, masked(kFull, valid, nan), masked(vFull, valid, nan), offBytes}
		p.refInputs = [][]byte{q, masked(kFull, valid, 0), masked(vFull, valid, 0), offBytes}
		before := len(res.Errors)
		got := r.verify(ctx, res, p)
		for i := before; i < len(res.Errors); i++ {
			res.Errors[i] = fmt.Sprintf("chunk %d (q_offset %d): %s", chunk, offset, res.Errors[i])
		}
		if got == nil {
			return
		}
	}
}
