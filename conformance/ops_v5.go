package conformance

import (
	"context"
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
)

// Op set v5: TANH, and ATTENTION's soft-cap, sliding window and Q8_0/Q4_0 K and V (a quantized
// KV cache), alone and in the combinations Gemma 2/3 and Mistral-style models run. The
// attention cases bind a KV cache whose rows no query may read (before the first query's
// window, past the last visible key) as NaN for the backend and zero for the reference, so a
// backend that reads them, or forgets the window, fails.

func v5Cases() []testCase {
	return append(tanhCases(), attentionV5Cases()...)
}

func tanhCases() []testCase {
	var cs []testCase
	for _, dt := range floatDTypes {
		for _, sh := range unaryShapes {
			cs = append(cs, graphCase(2, "TANH", dt.String(), caseName("TANH", "dtype", dt, "shape", sh),
				graphSpec{build: func(b *builder) { b.g.Output(b.g.Tanh(b.in("x", dt, sh, -4, 4))) }}))
		}
	}
	// wide inputs: tanh saturates to ±1, where (e^2x-1)/(e^2x+1) in f32 gives Inf/Inf = NaN
	return append(cs, graphCase(2, "TANH", "f32", caseName("TANH", "dtype", "f32", "shape", core.Shape{257}, "range", 100),
		graphSpec{build: func(b *builder) { b.g.Output(b.g.Tanh(b.in("x", core.F32, core.Shape{257}, -100, 100))) }}))
}

// attV5 is one ATTENTION case of op set v5. Every case but the non-causal ones reads its
// q_offset from the 4th input (as a decode does) unless offsetAttr is set.
type attV5 struct {
	tq, hq, hkv, d, dv int64
	off                int64 // q_offset
	extra              int64 // cache rows past q_offset+Tq: never visible
	window             int64
	softCap, scale     float32
	rng                float32 // q and k are U[-rng, rng]: large enough that the soft-cap bites
	offsetAttr         bool    // q_offset as iattr[1], not an input
	noCausal           bool
	h0, nh             int64 // a KV head range (op set 4): heads h0..h0+nh-1 of k and v; nh 0 = all
}

func attentionV5Cases() []testCase {
	// sliding window, soft-cap and both (Gemma 2/3's local layers), with float K/V
	float := []attV5{
		// decode rows: a window shorter than the keys, longer than them, and of one key
		{tq: 1, hq: 8, hkv: 2, d: 64, dv: 64, off: 70, extra: 3, window: 16, rng: 1},
		{tq: 1, hq: 4, hkv: 4, d: 32, dv: 32, off: 40, extra: 2, window: 128, rng: 1},
		{tq: 1, hq: 2, hkv: 1, d: 16, dv: 16, off: 9, extra: 1, window: 1, rng: 1},
		// prefill chunks: from the start, after a prefix, across 32-key blocks, a window longer
		// than the keys, and the offset as an attribute
		{tq: 9, hq: 4, hkv: 2, d: 32, dv: 32, off: 0, extra: 2, window: 4, rng: 1},
		{tq: 17, hq: 4, hkv: 1, d: 16, dv: 24, off: 30, extra: 0, window: 8, rng: 1},
		{tq: 40, hq: 2, hkv: 2, d: 32, dv: 32, off: 20, extra: 5, window: 33, rng: 1},
		{tq: 5, hq: 2, hkv: 1, d: 8, dv: 8, off: 3, extra: 4, window: 100, rng: 1},
		{tq: 3, hq: 3, hkv: 3, d: 8, dv: 8, off: 14, extra: 0, window: 5, rng: 1, offsetAttr: true},
		// soft-cap alone: decode, prefill, non-causal, and Gemma's c = 50 on scores that reach it
		{tq: 1, hq: 8, hkv: 2, d: 64, dv: 64, off: 50, extra: 2, softCap: 2, scale: 1, rng: 1},
		{tq: 6, hq: 4, hkv: 2, d: 32, dv: 32, off: 10, extra: 1, softCap: 0.5, rng: 1},
		{tq: 4, hq: 2, hkv: 1, d: 16, dv: 16, off: 5, softCap: 1, scale: 1, rng: 1, noCausal: true},
		{tq: 1, hq: 4, hkv: 2, d: 64, dv: 64, off: 33, extra: 2, softCap: 50, scale: 1, rng: 3},
		// Gemma 2/3 local layers: a window and a soft-cap, decode and prefill
		{tq: 1, hq: 8, hkv: 4, d: 128, dv: 128, off: 100, extra: 3, window: 32, softCap: 50, scale: 0.25, rng: 3},
		{tq: 12, hq: 4, hkv: 2, d: 32, dv: 32, off: 5, extra: 2, window: 6, softCap: 5, scale: 0.5, rng: 2},
		// one part of an attention split by heads (op set 4) on a local layer
		{tq: 1, hq: 4, hkv: 4, d: 32, dv: 32, off: 60, extra: 2, window: 16, softCap: 5, scale: 0.5, rng: 2, h0: 2, nh: 2},
		// decode rows deep in the cache with fewer head groups than threads: a CPU backend may
		// split the keys over its threads and merge their softmax states (flash-decoding);
		// whole, and through a window that starts mid-cache
		{tq: 1, hq: 8, hkv: 2, d: 64, dv: 64, off: 1100, extra: 3, rng: 1},
		{tq: 1, hq: 8, hkv: 2, d: 64, dv: 64, off: 1100, extra: 2, window: 700, softCap: 50, scale: 0.25, rng: 3},
	}
	// a quantized KV cache: decode and prefill, head dims of one and several 32-blocks, and
	// Gemma's window plus soft-cap over it
	quant := []attV5{
		{tq: 1, hq: 8, hkv: 2, d: 64, dv: 64, off: 70, extra: 3, rng: 1},
		{tq: 1, hq: 4, hkv: 4, d: 32, dv: 96, off: 15, extra: 1, rng: 1},
		{tq: 7, hq: 4, hkv: 2, d: 32, dv: 32, off: 9, extra: 2, rng: 1},
		{tq: 5, hq: 2, hkv: 1, d: 96, dv: 64, off: 0, extra: 3, rng: 1, offsetAttr: true},
		{tq: 1, hq: 8, hkv: 4, d: 128, dv: 128, off: 90, extra: 2, window: 32, softCap: 50, scale: 0.25, rng: 3},
		{tq: 6, hq: 4, hkv: 2, d: 64, dv: 64, off: 20, extra: 1, window: 8, softCap: 5, scale: 0.5, rng: 2},
		// a head range of a quantized cache: the range starts whole blocks into each row
		{tq: 1, hq: 8, hkv: 4, d: 64, dv: 32, off: 40, extra: 2, rng: 1, h0: 1, nh: 2},
		// a decode row deep in a quantized cache, its keys split over the threads
		{tq: 1, hq: 8, hkv: 2, d: 64, dv: 64, off: 1100, extra: 3, rng: 1},
	}
	var cs []testCase
	add := func(qdt, kvdt core.DType, v attV5) {
		name := caseName("ATTENTION", "q", qdt, "kv", kvdt, "tq", v.tq, "hq", v.hq, "hkv", v.hkv, "d", v.d,
			"dv", v.dv, "offset", v.off, "offset_input", !v.offsetAttr && !v.noCausal, "extra_rows", v.extra,
			"causal", !v.noCausal, "window", v.window, "softcap", v.softCap, "scale", v.scale, "range", v.rng,
			"kv_heads", fmt.Sprintf("%d+%d", v.h0, v.nh))
		cs = append(cs, testCase{name: name, level: 2, op: "ATTENTION", dtype: qdt.String() + "/" + kvdt.String(),
			v5:  v.window != 0 || v.softCap != 0,
			run: func(r *runner, ctx context.Context, res *CaseResult) { r.attentionV5(ctx, res, qdt, kvdt, v) }})
	}
	for _, dt := range floatDTypes {
		for _, v := range float {
			add(dt, dt, v)
		}
	}
	for _, qdt := range floatDTypes {
		for _, kvdt := range []core.DType{core.Q8_0, core.Q4_0} {
			for _, v := range quant {
				add(qdt, kvdt, v)
			}
		}
	}
	return cs
}

// attentionV5 runs one case: the backend's K and V hold NaN in every row no query may read.
func (r *runner) attentionV5(ctx context.Context, res *CaseResult, qdt, kvdt core.DType, v attV5) {
	tk := v.off + v.tq + v.extra
	lo, hi := int64(0), tk // the rows some query sees
	if !v.noCausal {
		hi = min(tk, v.off+v.tq)
		if v.window > 0 {
			lo = max(0, v.off-v.window+1)
		}
	}
	var kVals, vVals []float32
	p := r.prepare(ctx, res, func(b *builder) {
		q := b.in("q", qdt, core.Shape{v.tq, v.hq, v.d}, -v.rng, v.rng)
		kVals, vVals = b.uniform(tk*v.hkv*v.d, -v.rng, v.rng), b.uniform(tk*v.hkv*v.dv, -1, 1)
		k := b.inData("k_cache", kvdt, core.Shape{tk, v.hkv, v.d}, nil)
		vc := b.inData("v_cache", kvdt, core.Shape{tk, v.hkv, v.dv}, nil)
		o := core.AttentionOptions{Scale: v.scale, Causal: !v.noCausal, SoftCap: v.softCap, Window: v.window,
			KVHeadOffset: v.h0, KVHeads: v.nh}
		switch {
		case v.noCausal:
		case v.offsetAttr:
			o.QOffset = v.off
		default:
			o.QOffsetInput = b.inData("q_offset", core.I32, core.Shape{1}, core.EncodeI32([]int32{int32(v.off)}))
		}
		b.g.Output(b.g.Attention(q, k, vc, o))
	})
	if p == nil {
		return
	}
	defer closeAndRecord(res, "executable", p.exe)
	enc := newBuilder(nil)
	cache := func(vals []float32, row int64) (backend, ref []byte) {
		zeroed := append([]float32(nil), vals...)
		clear(zeroed[:lo*row])
		clear(zeroed[hi*row:])
		ref = enc.encode(kvdt, zeroed)
		backend = append([]byte(nil), ref...)
		rowBytes := kvdt.Bytes(row)
		poison(kvdt, backend[:lo*rowBytes])
		poison(kvdt, backend[hi*rowBytes:])
		return backend, ref
	}
	kb, kr := cache(kVals, v.hkv*v.d)
	vb, vr := cache(vVals, v.hkv*v.dv)
	if enc.err != nil {
		res.fail(CatError, "the suite could not build the case: %v", enc.err)
		return
	}
	in := p.inputs
	p.inputs = append([][]byte{in[0], kb, vb}, in[3:]...)
	p.refInputs = append([][]byte{in[0], kr, vr}, in[3:]...)
	r.verify(ctx, res, p)
}

// poison overwrites whole rows of a dt tensor with values that read as NaN: NaN elements for
// F32/F16, blocks whose f16 scale is NaN for Q8_0/Q4_0.
func poison(dt core.DType, b []byte) {
	switch dt {
	case core.F32:
		nan := math.Float32bits(float32(math.NaN()))
		for i := 0; i+4 <= len(b); i += 4 {
			b[i], b[i+1], b[i+2], b[i+3] = byte(nan), byte(nan>>8), byte(nan>>16), byte(nan>>24)
		}
	case core.F16:
		for i := 0; i+2 <= len(b); i += 2 {
			b[i], b[i+1] = 0x00, 0x7E
		}
	default: // a block type: the scale leads each block
		bs := int(dt.BlockBytes())
		for i := 0; i+bs <= len(b); i += bs {
			b[i], b[i+1] = 0x00, 0x7E
		}
	}
}
