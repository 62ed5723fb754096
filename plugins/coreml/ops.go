package coreml

import (
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
)

type valueFn func(t *core.Tensor, want milType) (mvar, error)

// lowerNode emits the MIL operations for one node and returns its output value. Norms, softmax,
// RoPE and attention of f16 graphs compute in f32 between casts: sums of squares and exponent
// sums overflow or lose too much in f16, and the result is rounded to f16 once, as OPS.md asks.
func lowerNode(b *builder, n *core.Node, value valueFn, inputIndex map[*core.Tensor]int, l *lowered) (mvar, error) {
	odt, ok := milDType(n.Output.DType)
	if !ok {
		return mvar{}, fmt.Errorf("output dtype %s: %w", n.Output.DType, core.ErrUnsupported)
	}
	oshape := []int64(n.Output.Shape)
	in := func(i int, dt milType) (mvar, error) { return value(n.Inputs[i], dt) }
	x, err := in(0, odt)
	if n.Op == core.OpCast || n.Op == core.OpGetRows {
		x, err = value(n.Inputs[0], 0)
	}
	if err != nil {
		return mvar{}, err
	}
	switch n.Op {
	case core.OpAdd, core.OpSub, core.OpMul, core.OpDiv:
		y, err := in(1, odt)
		if err != nil {
			return mvar{}, err
		}
		typ := map[core.Op]string{core.OpAdd: "add", core.OpSub: "sub", core.OpMul: "mul", core.OpDiv: "real_div"}[n.Op]
		return b.binary(typ, x, y, oshape), nil
	case core.OpSiLU:
		return b.unary("silu", x), nil
	case core.OpReLU:
		return b.unary("relu", x), nil
	case core.OpExp:
		return b.unary("exp", x), nil
	case core.OpTanh:
		return b.unary("tanh", x), nil
	case core.OpGELU:
		return b.op("gelu", []arg{{"x", []mvar{x}}, {"mode", []mvar{b.strScalar("TANH_APPROXIMATION")}}}, x.dt, x.shape), nil
	case core.OpNeg:
		return b.binary("mul", x, b.scalar(x.dt, -1), oshape), nil
	case core.OpScale:
		y := b.binary("mul", x, b.scalar(x.dt, n.FAttr[0]), oshape)
		return b.binary("add", y, b.scalar(x.dt, n.FAttr[1]), oshape), nil
	case core.OpRMSNorm:
		x32 := b.cast(x, milF32)
		red := append(append([]int64(nil), oshape[:len(oshape)-1]...), 1)
		m := b.op("reduce_mean", []arg{{"x", []mvar{b.binary("mul", x32, x32, oshape)}}, {"axes", []mvar{b.intVec(-1)}},
			{"keep_dims", []mvar{b.boolScalar(true)}}}, milF32, red)
		r := b.op("rsqrt", []arg{{"x", []mvar{m}}, {"epsilon", []mvar{b.scalar(milF32, n.FAttr[0])}}}, milF32, red)
		return b.cast(b.binary("mul", x32, r, oshape), odt), nil
	case core.OpLayerNorm:
		x32 := b.cast(x, milF32)
		y := b.op("layer_norm", []arg{{"x", []mvar{x32}}, {"axes", []mvar{b.intVec(-1)}},
			{"epsilon", []mvar{b.scalar(milF32, n.FAttr[0])}}}, milF32, oshape)
		return b.cast(y, odt), nil
	case core.OpSoftmax:
		return lowerSoftmax(b, n, x, oshape), nil
	case core.OpMatMul:
		y, err := in(1, odt)
		if err != nil {
			return mvar{}, err
		}
		return b.matmul(x, y, true, oshape), nil
	case core.OpRoPE:
		pos, err := in(1, milI32)
		if err != nil {
			return mvar{}, err
		}
		return b.cast(lowerRoPE(b, n, b.cast(x, milF32), pos), odt), nil
	case core.OpAttention:
		return lowerAttention(b, n, value)
	case core.OpGetRows:
		ids, err := value(n.Inputs[1], milI32)
		if err != nil {
			return mvar{}, err
		}
		l.idChecks = append(l.idChecks, idCheck{input: inputIndex[n.Inputs[1]], rows: n.Inputs[0].Shape[0]})
		if x.dt != milF32 && x.dt != milF16 {
			if x, err = value(n.Inputs[0], milF32); err != nil {
				return mvar{}, err
			}
		}
		gshape := append(append([]int64(nil), n.Inputs[1].Shape...), n.Inputs[0].Shape[1])
		gv := b.op("gather", []arg{{"x", []mvar{x}}, {"indices", []mvar{ids}}, {"axis", []mvar{b.intScalar(0)}}}, x.dt, gshape)
		return b.cast(gv, odt), nil
	case core.OpCast:
		return b.cast(x, odt), nil
	case core.OpReshape:
		return b.reshape(x, oshape), nil
	case core.OpPermute:
		return b.transpose(x, n.IAttr[:len(oshape)]), nil
	case core.OpSlice:
		axis := int(n.IAttr[0])
		return b.slice(x, axis, n.IAttr[1], n.IAttr[1]+oshape[axis]), nil
	case core.OpConcat:
		xs := []mvar{x}
		for i := 1; i < len(n.Inputs); i++ {
			v, err := in(i, odt)
			if err != nil {
				return mvar{}, err
			}
			xs = append(xs, v)
		}
		return b.concat(xs, int(n.IAttr[0])), nil
	}
	return mvar{}, fmt.Errorf("op %s is not lowered: %w", n.Op, core.ErrUnsupported)
}

func lowerSoftmax(b *builder, n *core.Node, x mvar, shape []int64) mvar {
	z := b.cast(x, milF32)
	if s := n.FAttr[0]; s != 0 && s != 1 {
		z = b.binary("mul", z, b.scalar(milF32, s), shape)
	}
	if n.IAttr[0] != 1 {
		return b.cast(b.softmax(z), x.dt)
	}
	m, nn := int64(1), shape[len(shape)-1]
	if len(shape) > 1 {
		m = shape[len(shape)-2]
	}
	keep, ones := causalMask(m, nn, func(i, j int64) bool { return j <= i+n.IAttr[1] })
	mshape := []int64{m, nn}
	z = b.selectOp(b.boolTensor(mshape, keep), z, b.scalar(milF32, negBig), shape)
	p := b.binary("mul", b.softmax(z), b.floats(milF32, mshape, ones, nil), shape)
	return b.cast(p, x.dt)
}

func causalMask(m, n int64, vis func(i, j int64) bool) ([]bool, []float32) {
	keep := make([]bool, m*n)
	ones := make([]float32, m*n)
	for i := range m {
		for j := range n {
			if vis(i, j) {
				keep[i*n+j], ones[i*n+j] = true, 1
			}
		}
	}
	return keep, ones
}

// lowerRoPE rotates x (f32, [..., T, H, D]) by angles pos*freq computed in f32.
func lowerRoPE(b *builder, n *core.Node, x, pos mvar) mvar {
	shape := x.shape
	r := len(shape)
	t, d := shape[r-3], shape[r-1]
	nrot := n.IAttr[1]
	if nrot == 0 {
		nrot = d
	}
	base, fs := float64(n.FAttr[0]), float64(n.FAttr[1])
	if base == 0 {
		base = 10000
	}
	if fs == 0 {
		fs = 1
	}
	half := nrot / 2
	inv := make([]float32, half)
	for i := range half {
		inv[i] = float32(fs * math.Pow(base, -2*float64(i)/float64(nrot)))
	}
	p := b.reshape(b.cast(pos, milF32), []int64{t, 1, 1})
	ang := b.binary("mul", p, b.floats(milF32, []int64{1, 1, half}, inv, nil), []int64{t, 1, half})
	cos, sin := b.unary("cos", ang), b.unary("sin", ang)
	rot := x
	if nrot != d {
		rot = b.slice(x, r-1, 0, nrot)
	}
	hshape := append(append([]int64(nil), shape[:r-1]...), half)
	var u, v mvar
	if n.IAttr[0] == 2 { // NeoX: (x[i], x[i+half])
		u, v = b.slice(rot, r-1, 0, half), b.slice(rot, r-1, half, nrot)
	} else { // normal: (x[2i], x[2i+1])
		pshape := append(append([]int64(nil), shape[:r-1]...), half, 2)
		pr := b.reshape(rot, pshape)
		u = b.reshape(b.slice(pr, r, 0, 1), hshape)
		v = b.reshape(b.slice(pr, r, 1, 2), hshape)
	}
	uo := b.binary("sub", b.binary("mul", u, cos, hshape), b.binary("mul", v, sin, hshape), hshape)
	vo := b.binary("add", b.binary("mul", u, sin, hshape), b.binary("mul", v, cos, hshape), hshape)
	var out mvar
	if n.IAttr[0] == 2 {
		out = b.concat([]mvar{uo, vo}, r-1)
	} else {
		eshape := append(append([]int64(nil), shape[:r-1]...), half, 1)
		out = b.reshape(b.concat([]mvar{b.reshape(uo, eshape), b.reshape(vo, eshape)}, r), append(append([]int64(nil), shape[:r-1]...), nrot))
	}
	if nrot != d {
		out = b.concat([]mvar{out, b.slice(x, r-1, nrot, d)}, r-1)
	}
	return out
}

// lowerAttention computes softmax(scale q k^T + mask) v per head in f32. Keys past the last
// visible one (a KV cache's unwritten tail, possibly NaN) are replaced by zeros with select before
// any arithmetic touches them, so "masked keys are never read" holds for the values' effect.
func lowerAttention(b *builder, n *core.Node, value valueFn) (mvar, error) {
	q, err := value(n.Inputs[0], milF32)
	if err != nil {
		return mvar{}, err
	}
	k, err := value(n.Inputs[1], milF32)
	if err != nil {
		return mvar{}, err
	}
	v, err := value(n.Inputs[2], milF32)
	if err != nil {
		return mvar{}, err
	}
	tq, hq, d := q.shape[0], q.shape[1], q.shape[2]
	tk, hkv, dv := k.shape[0], k.shape[1], v.shape[2]
	g := hq / hkv
	scale := float64(n.FAttr[0])
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(d))
	}
	causal := n.IAttr[0] == 1
	var keep mvar  // bool [tq, tk]: query i sees key j
	var keyOK mvar // bool [tk, 1, 1]: some query sees key j
	if causal {
		var off mvar
		if len(n.Inputs) > 3 {
			if off, err = value(n.Inputs[3], milI32); err != nil {
				return mvar{}, err
			}
		} else {
			off = b.intVec(n.IAttr[1])
		}
		rows := make([]int64, tq)
		for i := range rows {
			rows[i] = int64(i)
		}
		cols := make([]int64, tk)
		for j := range cols {
			cols[j] = int64(j)
		}
		last := b.binary("add", b.constInts([]int64{tq, 1}, rows), off, []int64{tq, 1}) // i + q_offset
		colv := b.constInts([]int64{1, tk}, cols)
		keep = b.binary("less_equal", colv, last, []int64{tq, tk})
		maxVis := b.binary("add", off, b.intVec(tq-1), []int64{1})
		colk := b.constInts([]int64{tk, 1, 1}, cols)
		keyOK = b.binary("less_equal", colk, maxVis, []int64{tk, 1, 1})
		if w := n.IAttr[4]; w > 0 {
			// sliding window (op set 5): query i sees keys j >= i + q_offset - w + 1, and no
			// query sees a key before the first query's window, so those rows are zeroed too
			first := b.binary("add", last, b.intVec(1-w), []int64{tq, 1})
			keep = b.binary("logical_and", keep, b.binary("less_equal", first, colv, []int64{tq, tk}), []int64{tq, tk})
			minVis := b.binary("add", off, b.intVec(1-w), []int64{1})
			keyOK = b.binary("logical_and", keyOK, b.binary("less_equal", minVis, colk, []int64{tk, 1, 1}), []int64{tk, 1, 1})
		}
		zeros := b.floats(milF32, nil, []float32{0}, nil)
		k = b.selectOp(keyOK, k, zeros, k.shape)
		v = b.selectOp(keyOK, v, zeros, v.shape)
	}
	qh := b.reshape(b.transpose(q, []int64{1, 0, 2}), []int64{hkv, g * tq, d}) // [hkv, g*tq, d]
	kh := b.transpose(k, []int64{1, 0, 2})                                     // [hkv, tk, d]
	vh := b.transpose(v, []int64{1, 0, 2})                                     // [hkv, tk, dv]
	s := b.matmul(qh, kh, true, []int64{hkv, g * tq, tk})
	s = b.binary("mul", s, b.scalar(milF32, float32(scale)), s.shape)
	if c := n.FAttr[1]; c > 0 { // soft-cap (op set 5): c * tanh(s / c)
		s = b.binary("mul", b.unary("tanh", b.binary("mul", s, b.scalar(milF32, 1/c), s.shape)), b.scalar(milF32, c), s.shape)
	}
	s = b.reshape(s, []int64{hq, tq, tk})
	if causal {
		s = b.selectOp(keep, s, b.scalar(milF32, negBig), s.shape)
	}
	p := b.softmax(s)
	if causal {
		// bool to float through select: cast of bool is not in the iOS 16 opset
		p = b.selectOp(keep, p, b.floats(milF32, nil, []float32{0}, nil), p.shape)
	}
	o := b.matmul(b.reshape(p, []int64{hkv, g * tq, tk}), vh, false, []int64{hkv, g * tq, dv})
	o = b.transpose(b.reshape(o, []int64{hq, tq, dv}), []int64{1, 0, 2})
	odt, _ := milDType(n.Output.DType)
	return b.cast(o, odt), nil
}
