package ref

import (
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
)

// evalBinary is ADD, SUB, MUL, DIV with numpy broadcasting.
func evalBinary(n *nodeInfo, in []value, out tensorInfo) ([]byte, error) {
	a, b, err := floats2(in)
	if err != nil {
		return nil, err
	}
	f := map[core.Op]func(x, y float64) float64{
		core.OpAdd: func(x, y float64) float64 { return x + y },
		core.OpSub: func(x, y float64) float64 { return x - y },
		core.OpMul: func(x, y float64) float64 { return x * y },
		core.OpDiv: func(x, y float64) float64 { return x / y },
	}[n.op]
	res := make([]float64, out.shape.NumElements())
	sa, sb := broadcastStrides(in[0].shape, out.shape), broadcastStrides(in[1].shape, out.shape)
	idx := make([]int, len(out.shape))
	for i := range res {
		unravel(i, out.shape, idx)
		res[i] = f(a[dot(idx, sa)], b[dot(idx, sb)])
	}
	return encode(out.dt, res)
}

// evalUnary is SILU, GELU, RELU, EXP, NEG and SCALE.
func evalUnary(n *nodeInfo, x value) ([]byte, error) {
	xs, err := x.floats(0)
	if err != nil {
		return nil, err
	}
	var f func(float64) float64
	switch n.op {
	case core.OpSiLU:
		f = func(v float64) float64 { return v / (1 + math.Exp(-v)) }
	case core.OpGELU:
		c := math.Sqrt(2 / math.Pi)
		f = func(v float64) float64 { return 0.5 * v * (1 + math.Tanh(c*(v+0.044715*v*v*v))) }
	case core.OpReLU:
		f = func(v float64) float64 {
			if v > 0 || v != v {
				return v
			}
			return 0
		}
	case core.OpExp:
		f = math.Exp
	case core.OpNeg:
		f = func(v float64) float64 { return -v }
	case core.OpTanh:
		f = math.Tanh
	case core.OpScale:
		s, b := float64(n.fattr[0]), float64(n.fattr[1])
		f = func(v float64) float64 { return v*s + b }
	default:
		return nil, fmt.Errorf("not a unary op: %w", core.ErrInternal)
	}
	for i, v := range xs {
		xs[i] = f(v)
	}
	return encode(x.dt, xs)
}
