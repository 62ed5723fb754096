package ref

import (
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
)

// Op set 3: SPARSE_FFN, PowerInfer-2's neuron-bundle FFN (abi/OPS.md "SPARSE_FFN").

// sparseAct applies SPARSE_FFN's activation iattr[0] to v.
func sparseAct(act int64, v float64) float64 {
	switch core.SparseAct(act) {
	case core.SparseReLU:
		return math.Max(v, 0)
	case core.SparseReLU2:
		r := math.Max(v, 0)
		return r * r
	}
	return v / (1 + math.Exp(-v))
}

// evalSparseFFN is out[m, :] = Σ_{k: idx[k] ≥ 0} h(m, idx[k]) · down(idx[k]). Only the bundle
// rows idx lists are decoded (bundles is a large cache; most rows are not used by one call), and
// a neuron whose gate activation is exactly 0 contributes nothing, so its up and down segments
// are not decoded for that row of x. NaN activations are not 0 and propagate.
func evalSparseFFN(n *nodeInfo, in []value, out tensorInfo) ([]byte, error) {
	x, err := in[0].floats(0)
	if err != nil {
		return nil, err
	}
	b, idx := in[1], in[2].ints()
	S, R := int(b.shape[0]), b.shape[1]
	D := int(in[0].shape[len(in[0].shape)-1])
	M := len(x) / D
	ungated := n.iattr[1] == 1
	act := n.iattr[0]
	rowBytes := b.dt.Bytes(R)
	segBytes := b.dt.Bytes(int64(D))
	for k, id := range idx {
		if id < -1 || int(id) >= S {
			return nil, fmt.Errorf("idx[%d] = %d is outside [-1, %d): %w", k, id, S, core.ErrInvalidArgument)
		}
	}
	// segment j of bundle row id, decoded.
	seg := func(id int32, j int) ([]float64, error) {
		off := int64(id)*rowBytes + int64(j)*segBytes
		if off+segBytes > int64(len(b.b)) {
			return nil, fmt.Errorf("bundle row %d segment %d lies past the %d bytes of bundles: %w", id, j, len(b.b), core.ErrInternal)
		}
		return value{dt: b.dt, shape: core.Shape{int64(D)}, b: b.b[off : off+segBytes]}.floats(0)
	}
	dotX := func(w []float64, m int) float64 {
		var acc float64
		xm := x[m*D : (m+1)*D]
		for i, v := range w {
			acc += v * xm[i]
		}
		return acc
	}
	res := make([]float64, M*D)
	for _, id := range idx {
		if id < 0 {
			continue
		}
		first, err := seg(id, 0)
		if err != nil {
			return nil, err
		}
		// on[m]: the activation of row m is not 0, so the neuron contributes (even if up·x is 0:
		// 0 times an infinite down weight is NaN, as in the dense product).
		h, on := make([]float64, M), make([]bool, M)
		live := false
		var up []float64
		for m := range h {
			a := sparseAct(act, dotX(first, m))
			if a == 0 {
				continue // the skip OPS.md prescribes: neither up·x nor down is needed
			}
			on[m], live = true, true
			if ungated {
				h[m] = a
				continue
			}
			if up == nil {
				if up, err = seg(id, 1); err != nil {
					return nil, err
				}
			}
			h[m] = a * dotX(up, m)
		}
		if !live {
			continue
		}
		downSeg := 2
		if ungated {
			downSeg = 1
		}
		down, err := seg(id, downSeg)
		if err != nil {
			return nil, err
		}
		for m, hm := range h {
			if !on[m] {
				continue
			}
			row := res[m*D : (m+1)*D]
			for i, w := range down {
				row[i] += hm * w
			}
		}
	}
	return encode(out.dt, res)
}
