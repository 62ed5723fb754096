package core

import (
	"fmt"
	"math"
)

// InferOutput checks a node's inputs and attributes against abi/OPS.md and returns the output
// dtype and shape. forceDType/forceShape carry the output type for ops whose output is not
// determined by the inputs (RESHAPE, CAST, QUANTIZE, SLICE); pass the node's output when
// re-validating. Every input and the output must be within MaxDim and MaxElements, so no
// element count in the check (or in a backend) can wrap.
func InferOutput(n *Node, forceDType DType, forceShape Shape) (DType, Shape, error) {
	for i, t := range n.Inputs {
		if t == nil {
			return 0, nil, fmt.Errorf("input %d is nil", i)
		}
		if err := checkShape(t.DType, t.Shape); err != nil {
			return 0, nil, fmt.Errorf("input %d (%s): %w", i, t.Name, err)
		}
	}
	dt, shape, err := inferOutput(n, forceDType, forceShape)
	if err != nil {
		return 0, nil, err
	}
	if err := checkShape(dt, shape); err != nil {
		return 0, nil, fmt.Errorf("output: %w", err)
	}
	return dt, shape, nil
}

func inferOutput(n *Node, forceDType DType, forceShape Shape) (DType, Shape, error) {
	in := n.Inputs
	if len(forceShape) > MaxRank {
		return 0, nil, fmt.Errorf("output rank %d > %d", len(forceShape), MaxRank)
	}
	need := func(lo, hi int) error {
		if len(in) < lo || len(in) > hi {
			if lo == hi {
				return fmt.Errorf("takes %d inputs, got %d", lo, len(in))
			}
			return fmt.Errorf("takes %d to %d inputs, got %d", lo, hi, len(in))
		}
		return nil
	}
	float := func(i int) error {
		if !in[i].DType.Float() {
			return fmt.Errorf("input %d (%s) must be f32 or f16, got %s", i, in[i].Name, in[i].DType)
		}
		return nil
	}
	switch op := n.Op; {
	case op.Binary():
		if err := need(2, 2); err != nil {
			return 0, nil, err
		}
		if err := float(0); err != nil {
			return 0, nil, err
		}
		if in[0].DType != in[1].DType {
			return 0, nil, fmt.Errorf("dtypes differ: %s and %s", in[0].DType, in[1].DType)
		}
		s, err := BroadcastShapes(in[0].Shape, in[1].Shape)
		return in[0].DType, s, err

	case op.Elementwise(), op == OpRMSNorm, op == OpLayerNorm, op == OpSoftmax:
		if err := need(1, 1); err != nil {
			return 0, nil, err
		}
		if err := float(0); err != nil {
			return 0, nil, err
		}
		if (op == OpRMSNorm || op == OpLayerNorm || op == OpSoftmax) && len(in[0].Shape) == 0 {
			return 0, nil, fmt.Errorf("needs rank >= 1")
		}
		if op == OpSoftmax && n.IAttr[0] != 0 && len(in[0].Shape) < 2 {
			return 0, nil, fmt.Errorf("causal softmax needs rank >= 2")
		}
		return in[0].DType, in[0].Shape.Clone(), nil

	case op == OpMatMul:
		return inferMatMul(n, forceDType)

	case op == OpShadowMatMul:
		return inferShadowMatMul(n)

	case op == OpSparseFFN:
		return inferSparseFFN(n)

	case op == OpRoPE:
		if err := need(2, 2); err != nil {
			return 0, nil, err
		}
		if err := float(0); err != nil {
			return 0, nil, err
		}
		x, pos := in[0].Shape, in[1].Shape
		if len(x) != 3 && len(x) != 4 {
			return 0, nil, fmt.Errorf("x must be [T,H,D] or [B,T,H,D], got %s", x)
		}
		T, D := x[len(x)-3], x[len(x)-1]
		if in[1].DType != I32 || len(pos) != 1 || pos[0] != T {
			return 0, nil, fmt.Errorf("positions must be i32 [%d], got %s%s", T, in[1].DType, pos)
		}
		nrot := n.IAttr[1]
		if nrot == 0 {
			nrot = D
		}
		if nrot < 0 || nrot > D || nrot%2 != 0 {
			return 0, nil, fmt.Errorf("rotary dims %d must be even and <= head dim %d", nrot, D)
		}
		if m := n.IAttr[0]; m != RoPENormal && m != RoPENeoX {
			return 0, nil, fmt.Errorf("unknown rope mode %d", m)
		}
		return in[0].DType, x.Clone(), nil

	case op == OpAttention:
		if err := need(3, 5); err != nil {
			return 0, nil, err
		}
		if err := float(0); err != nil {
			return 0, nil, err
		}
		q, k, v := in[0].Shape, in[1].Shape, in[2].Shape
		if len(q) != 3 || len(k) != 3 || len(v) != 3 {
			return 0, nil, fmt.Errorf("q, k, v must be rank 3 [T,H,D], got %s %s %s", q, k, v)
		}
		for _, t := range in[1:3] {
			switch t.DType {
			case F32, F16:
			case Q8_0, Q4_0:
				if t.Shape[2]%32 != 0 {
					return 0, nil, fmt.Errorf("a %s k or v needs a head dim that is a multiple of 32, got %d", t.DType, t.Shape[2])
				}
			default:
				return 0, nil, fmt.Errorf("k and v must be f32, f16, q8_0 or q4_0, got %s", t.DType)
			}
		}
		if c := n.FAttr[1]; !(c >= 0) || math.IsInf(float64(c), 0) {
			return 0, nil, fmt.Errorf("soft-cap fattr[1] = %v must be finite and >= 0", c)
		}
		if w := n.IAttr[4]; w != 0 {
			if w < 0 {
				return 0, nil, fmt.Errorf("sliding window iattr[4] = %d must be >= 0", w)
			}
			if n.IAttr[0] != 1 || len(in) == 5 {
				return 0, nil, fmt.Errorf("a sliding window needs causal attention and no mask")
			}
		}
		if k[0] != v[0] || k[1] != v[1] {
			return 0, nil, fmt.Errorf("k %s and v %s differ in length or heads", k, v)
		}
		if q[2] != k[2] {
			return 0, nil, fmt.Errorf("q head dim %d != k head dim %d", q[2], k[2])
		}
		kvHeads := k[1]
		if h0, nh := n.IAttr[2], n.IAttr[3]; nh != 0 || h0 != 0 {
			if nh <= 0 || h0 < 0 || h0+nh > k[1] {
				return 0, nil, fmt.Errorf("kv head range [%d, %d+%d) outside k's %d heads", h0, h0, nh, k[1])
			}
			kvHeads = nh
		}
		if kvHeads == 0 || q[1]%kvHeads != 0 {
			return 0, nil, fmt.Errorf("query heads %d not a multiple of kv heads %d", q[1], kvHeads)
		}
		if len(in) >= 4 && (in[3].DType != I32 || in[3].Shape.NumElements() != 1) {
			return 0, nil, fmt.Errorf("q_offset must be i32 [1], got %s", in[3])
		}
		if len(in) == 5 {
			if n.IAttr[0] != 1 {
				return 0, nil, fmt.Errorf("a mask needs causal attention (iattr[0] = 1)")
			}
			if m := in[4]; m.DType != I8 || len(m.Shape) != 2 || m.Shape[0] != q[0] || m.Shape[1] != q[0] {
				return 0, nil, fmt.Errorf("mask must be i8 [%d,%d], got %s", q[0], q[0], m)
			}
		}
		return in[0].DType, Shape{q[0], q[1], v[2]}, nil

	case op == OpGetRows:
		if err := need(2, 2); err != nil {
			return 0, nil, err
		}
		t, ids := in[0], in[1]
		if len(t.Shape) != 2 {
			return 0, nil, fmt.Errorf("table must be rank 2, got %s", t.Shape)
		}
		switch t.DType {
		case F32, F16, BF16, Q8_0, Q4_0, I8, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K:
		default:
			return 0, nil, fmt.Errorf("table dtype %s not allowed", t.DType)
		}
		if ids.DType != I32 || len(ids.Shape) > MaxRank-1 {
			return 0, nil, fmt.Errorf("ids must be i32 of rank <= 3, got %s", ids)
		}
		return F32, append(ids.Shape.Clone(), t.Shape[1]), nil

	case op == OpCast:
		if err := need(1, 1); err != nil {
			return 0, nil, err
		}
		from, to := in[0].DType, forceDType
		okFrom := from == F32 || from == F16 || from == BF16 || from == I32
		okTo := to == F32 || to == F16 || to == BF16
		if !okFrom || !okTo {
			return 0, nil, fmt.Errorf("cast %s -> %s not allowed", from, to)
		}
		return to, in[0].Shape.Clone(), nil

	case op == OpQuantize:
		if err := need(1, 1); err != nil {
			return 0, nil, err
		}
		if in[0].DType != F32 {
			return 0, nil, fmt.Errorf("quantize needs f32 input, got %s", in[0].DType)
		}
		to := forceDType
		if !to.Quantized() && to != I8 {
			return 0, nil, fmt.Errorf("quantize to %s not allowed", to)
		}
		if to == I8 && !(n.FAttr[0] > 0) {
			return 0, nil, fmt.Errorf("i8 quantize needs a positive scale")
		}
		if err := checkShape(to, in[0].Shape); err != nil {
			return 0, nil, err
		}
		return to, in[0].Shape.Clone(), nil

	case op == OpDequantize:
		if err := need(1, 1); err != nil {
			return 0, nil, err
		}
		if d := in[0].DType; !d.Quantized() && d != I8 {
			return 0, nil, fmt.Errorf("dequantize needs q8_0, q4_0, a k-quant or i8, got %s", d)
		}
		return F32, in[0].Shape.Clone(), nil

	case op == OpReshape:
		if err := need(1, 1); err != nil {
			return 0, nil, err
		}
		if err := checkShape(in[0].DType, forceShape); err != nil {
			return 0, nil, err
		}
		if forceShape.NumElements() != in[0].Shape.NumElements() {
			return 0, nil, fmt.Errorf("reshape %s -> %s changes the element count", in[0].Shape, forceShape)
		}
		return in[0].DType, forceShape.Clone(), nil

	case op == OpPermute:
		if err := need(1, 1); err != nil {
			return 0, nil, err
		}
		if err := movable(in[0]); err != nil {
			return 0, nil, err
		}
		x := in[0].Shape
		out := make(Shape, len(x))
		seen := make([]bool, len(x))
		for d := range x {
			p := n.IAttr[d]
			if p < 0 || int(p) >= len(x) || seen[p] {
				return 0, nil, fmt.Errorf("perm %v is not a permutation of %d axes", n.IAttr[:len(x)], len(x))
			}
			seen[p] = true
			out[d] = x[p]
		}
		return in[0].DType, out, nil

	case op == OpSlice:
		if err := need(1, 1); err != nil {
			return 0, nil, err
		}
		if err := movable(in[0]); err != nil {
			return 0, nil, err
		}
		x := in[0].Shape
		axis, start := n.IAttr[0], n.IAttr[1]
		if axis < 0 || int(axis) >= len(x) {
			return 0, nil, fmt.Errorf("axis %d out of range for %s", axis, x)
		}
		if len(forceShape) != len(x) {
			return 0, nil, fmt.Errorf("slice output rank %d != input rank %d", len(forceShape), len(x))
		}
		for d := range x {
			if d != int(axis) && forceShape[d] != x[d] {
				return 0, nil, fmt.Errorf("slice changes axis %d (only axis %d may change)", d, axis)
			}
		}
		if start < 0 || start+forceShape[axis] > x[axis] || forceShape[axis] < 0 {
			return 0, nil, fmt.Errorf("slice [%d, %d) out of range 0..%d", start, start+forceShape[axis], x[axis])
		}
		return in[0].DType, forceShape.Clone(), nil

	case op == OpConcat:
		if err := need(1, MaxInputs); err != nil {
			return 0, nil, err
		}
		x := in[0].Shape
		axis := n.IAttr[0]
		if axis < 0 || int(axis) >= len(x) {
			return 0, nil, fmt.Errorf("axis %d out of range for %s", axis, x)
		}
		out := x.Clone()
		for i, t := range in {
			if err := movable(t); err != nil {
				return 0, nil, err
			}
			if t.DType != in[0].DType || len(t.Shape) != len(x) {
				return 0, nil, fmt.Errorf("input %d (%s) differs in dtype or rank from input 0", i, t)
			}
			for d := range x {
				if d != int(axis) && t.Shape[d] != x[d] {
					return 0, nil, fmt.Errorf("input %d shape %s differs from %s off axis %d", i, t.Shape, x, axis)
				}
			}
			if i > 0 {
				out[axis] += t.Shape[axis]
			}
		}
		return in[0].DType, out, nil
	}
	return 0, nil, fmt.Errorf("unknown op %s", n.Op)
}

// movable: dtypes the data-movement ops handle.
func movable(t *Tensor) error {
	switch t.DType {
	case F32, F16, BF16, I32, I8:
		return nil
	}
	return fmt.Errorf("%s: dtype %s cannot be moved element-wise", t.Name, t.DType)
}

func inferMatMul(n *Node, forceDType DType) (DType, Shape, error) {
	if len(n.Inputs) != 2 && len(n.Inputs) != 3 {
		return 0, nil, fmt.Errorf("takes 2 or 3 inputs, got %d", len(n.Inputs))
	}
	a, b := n.Inputs[0], n.Inputs[1]
	w8a8 := a.DType == I8
	if !a.DType.Float() && !w8a8 {
		return 0, nil, fmt.Errorf("a must be f32, f16 or (with an i8 b) i8, got %s", a.DType)
	}
	outDType := a.DType
	if w8a8 {
		if b.DType != I8 {
			return 0, nil, fmt.Errorf("an i8 a needs an i8 b, got %s", b.DType)
		}
		if !(n.FAttr[1] > 0) || isInf32(n.FAttr[1]) {
			return 0, nil, fmt.Errorf("an i8 a needs a positive finite scale in fattr[1], got %g", n.FAttr[1])
		}
		if so := n.FAttr[2]; !(so >= 0) || isInf32(so) {
			return 0, nil, fmt.Errorf("the output grid scale fattr[2] must be 0 or positive and finite, got %g", so)
		}
		if r := len(a.Shape); r > 0 && a.Shape[r-1] >= 1<<17 {
			return 0, nil, fmt.Errorf("an i8 a needs K < 2^17 (exact int32 sums), got K = %d", a.Shape[r-1])
		}
		if forceDType != F32 && forceDType != F16 {
			return 0, nil, fmt.Errorf("an i8 a gives an f32 or f16 output, not %s", forceDType)
		}
		outDType = forceDType
	} else if n.FAttr[1] != 0 || n.FAttr[2] != 0 {
		return 0, nil, fmt.Errorf("fattr[1] (a scale) and fattr[2] (output grid) need an i8 a")
	}
	if len(n.Inputs) == 3 {
		s := n.Inputs[2]
		if b.DType != I8 {
			return 0, nil, fmt.Errorf("per-channel scales (3rd input) need an i8 b, got %s", b.DType)
		}
		if n.FAttr[0] != 0 {
			return 0, nil, fmt.Errorf("with per-channel scales fattr[0] must be 0, got %g", n.FAttr[0])
		}
		if len(b.Shape) != 2 || s.DType != F32 || len(s.Shape) != 1 || s.Shape[0] != b.Shape[0] {
			return 0, nil, fmt.Errorf("per-channel scales must be f32 [N] for b %s, got %s", b.Shape, s)
		}
		if err := positiveScales(s); err != nil {
			return 0, nil, err
		}
	} else if b.DType == I8 && (!(n.FAttr[0] > 0) || isInf32(n.FAttr[0])) {
		return 0, nil, fmt.Errorf("i8 b needs a positive finite scale in fattr[0] (or per-channel scales)")
	}
	if len(a.Shape) < 1 || len(b.Shape) < 2 {
		return 0, nil, fmt.Errorf("a needs rank >= 1 and b rank >= 2, got %s and %s", a.Shape, b.Shape)
	}
	switch b.DType {
	case F32, F16, BF16:
	case Q8_0, Q4_0, I8, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K:
		if len(b.Shape) != 2 {
			return 0, nil, fmt.Errorf("a %s b must be rank 2, got %s", b.DType, b.Shape)
		}
	default:
		return 0, nil, fmt.Errorf("b dtype %s not allowed", b.DType)
	}
	K := a.Shape[len(a.Shape)-1]
	N, Kb := b.Shape[len(b.Shape)-2], b.Shape[len(b.Shape)-1]
	if K != Kb {
		return 0, nil, fmt.Errorf("inner dims differ: a %s, b %s (b is [N,K])", a.Shape, b.Shape)
	}
	if len(a.Shape) == 1 {
		if len(b.Shape) != 2 {
			return 0, nil, fmt.Errorf("rank-1 a needs a rank-2 b")
		}
		return outDType, Shape{N}, nil
	}
	M := a.Shape[len(a.Shape)-2]
	batch, err := BroadcastShapes(a.Shape[:len(a.Shape)-2], b.Shape[:len(b.Shape)-2])
	if err != nil {
		return 0, nil, fmt.Errorf("batch dims: %w", err)
	}
	return outDType, append(batch, M, N), nil
}

// BroadcastShapes applies numpy broadcasting to two shapes.
func BroadcastShapes(a, b Shape) (Shape, error) {
	r := max(len(a), len(b))
	out := make(Shape, r)
	for i := 0; i < r; i++ {
		da, db := int64(1), int64(1)
		if j := len(a) - r + i; j >= 0 {
			da = a[j]
		}
		if j := len(b) - r + i; j >= 0 {
			db = b[j]
		}
		switch {
		case da == db:
			out[i] = da
		case da == 1:
			out[i] = db
		case db == 1:
			out[i] = da
		default:
			return nil, fmt.Errorf("shapes %s and %s do not broadcast", a, b)
		}
	}
	return out, nil
}

// positiveScales checks a constant scale tensor's values (> 0 and finite); an input's values
// are only known at execution, where the backends check them.
func positiveScales(s *Tensor) error {
	if s.Kind != KindConst || s.Data == nil {
		return nil
	}
	xs, err := Dequantize(F32, s.Data, 0)
	if err != nil {
		return err
	}
	for i, x := range xs {
		if !(x > 0) || isInf32(x) {
			return fmt.Errorf("per-channel scale %d is %g, must be positive and finite", i, x)
		}
	}
	return nil
}

func isInf32(x float32) bool { return x > math.MaxFloat32 || x < -math.MaxFloat32 }

// inferShadowMatMul: x [M, K] or [K] float, wt [C, N] F32/F16, ids I32 [C] (or none: C = K),
// threshold fattr[0] > 0 → [M, N] or [N] in x's dtype.
func inferShadowMatMul(n *Node) (DType, Shape, error) {
	in := n.Inputs
	if len(in) != 2 && len(in) != 3 {
		return 0, nil, fmt.Errorf("takes 2 or 3 inputs, got %d", len(in))
	}
	x, wt := in[0], in[1]
	if !x.DType.Float() || (len(x.Shape) != 1 && len(x.Shape) != 2) {
		return 0, nil, fmt.Errorf("x must be f32 or f16 [M,K] or [K], got %s", x)
	}
	if !wt.DType.Float() || len(wt.Shape) != 2 {
		return 0, nil, fmt.Errorf("wt must be f32 or f16 [C,N], got %s", wt)
	}
	K := x.Shape[len(x.Shape)-1]
	C, N := wt.Shape[0], wt.Shape[1]
	if len(in) == 3 {
		ids := in[2]
		if ids.DType != I32 || len(ids.Shape) != 1 || ids.Shape[0] != C {
			return 0, nil, fmt.Errorf("ids must be i32 [%d] (one per row of wt), got %s", C, ids)
		}
		if ids.Kind == KindConst && ids.Data != nil {
			for i, id := range DecodeI32(ids.Data) {
				if int64(id) < 0 || int64(id) >= K {
					return 0, nil, fmt.Errorf("ids[%d] = %d is outside [0, %d)", i, id, K)
				}
			}
		}
	} else if C != K {
		return 0, nil, fmt.Errorf("without ids wt needs one row per input channel (%d), got %s", K, wt.Shape)
	}
	if t := n.FAttr[0]; !(t > 0) {
		return 0, nil, fmt.Errorf("the threshold fattr[0] must be positive, got %g", t)
	}
	if len(x.Shape) == 1 {
		return x.DType, Shape{N}, nil
	}
	return x.DType, Shape{x.Shape[0], N}, nil
}

// inferSparseFFN: x [M, D] or [D] float, bundles [S, R] F32/F16/Q8_0/Q4_0 with R ≥ 3D (gated)
// or 2D (ungated), idx I32 [K] → x's shape and dtype.
func inferSparseFFN(n *Node) (DType, Shape, error) {
	in := n.Inputs
	if len(in) != 3 {
		return 0, nil, fmt.Errorf("takes 3 inputs (x, bundles, idx), got %d", len(in))
	}
	x, b, idx := in[0], in[1], in[2]
	if !x.DType.Float() || (len(x.Shape) != 1 && len(x.Shape) != 2) {
		return 0, nil, fmt.Errorf("x must be f32 or f16 [M,D] or [D], got %s", x)
	}
	switch b.DType {
	case F32, F16, Q8_0, Q4_0:
	default:
		return 0, nil, fmt.Errorf("bundles must be f32, f16, q8_0 or q4_0, got %s", b.DType)
	}
	if len(b.Shape) != 2 {
		return 0, nil, fmt.Errorf("bundles must be [S,R], got %s", b.Shape)
	}
	if idx.DType != I32 || len(idx.Shape) != 1 {
		return 0, nil, fmt.Errorf("idx must be i32 [K], got %s", idx)
	}
	act, ungated := n.IAttr[0], n.IAttr[1]
	if act < 0 || act > int64(SparseSiLU) {
		return 0, nil, fmt.Errorf("activation iattr[0] = %d (0 ReLU, 1 ReLU², 2 SiLU)", act)
	}
	if ungated != 0 && ungated != 1 {
		return 0, nil, fmt.Errorf("iattr[1] (ungated) must be 0 or 1, got %d", ungated)
	}
	D, S, R := x.Shape[len(x.Shape)-1], b.Shape[0], b.Shape[1]
	seg := int64(3)
	if ungated == 1 {
		seg = 2
	}
	if D == 0 || R < seg*D {
		return 0, nil, fmt.Errorf("bundle rows of %d values cannot hold %d segments of D = %d", R, seg, D)
	}
	if b.DType.Quantized() && (D%32 != 0 || R%32 != 0) {
		return 0, nil, fmt.Errorf("%s bundles need D (%d) and R (%d) multiples of 32", b.DType, D, R)
	}
	if idx.Kind == KindConst && idx.Data != nil {
		for i, v := range DecodeI32(idx.Data) {
			if int64(v) < -1 || int64(v) >= S {
				return 0, nil, fmt.Errorf("idx[%d] = %d is outside [-1, %d)", i, v, S)
			}
		}
	}
	return x.DType, x.Shape.Clone(), nil
}
