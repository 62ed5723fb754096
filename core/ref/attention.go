package ref

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/floats"

	"github.com/xpuhub/xpu/core"
)

// evalAttention is fused grouped-query attention, over all of k's KV heads or a range of them.
// It decodes only the K and V rows some query can see: a KV cache bound at full capacity holds
// garbage (even NaN) past its valid length.
func evalAttention(n *nodeInfo, in []value, out tensorInfo) ([]byte, error) {
	q, k, v := in[0], in[1], in[2]
	Tq, Hq, D := int(q.shape[0]), int(q.shape[1]), int(q.shape[2])
	Tk, Hkv, Dv := int(k.shape[0]), int(k.shape[1]), int(v.shape[2])
	off := n.iattr[1]
	if len(in) >= 4 {
		off = int64(in[3].ints()[0])
	}
	var mask []byte
	if len(in) == 5 {
		mask = in[4].b
	}
	vis := attnVisibility{causal: n.iattr[0] != 0, off: off, tq: int64(Tq), tk: int64(Tk), mask: mask, window: n.iattr[4]}
	softCap := float64(n.fattr[1])
	scale := float64(n.fattr[0])
	if scale == 0 && D > 0 {
		scale = 1 / math.Sqrt(float64(D))
	}
	res := make([]float64, out.shape.NumElements())
	if len(res) == 0 || Tq == 0 {
		return encode(out.dt, res)
	}
	seen := vis.rowsRead()
	kf, err := decodeRows(k, seen)
	if err != nil {
		return nil, err
	}
	vf, err := decodeRows(v, seen)
	if err != nil {
		return nil, err
	}
	qf, err := q.floats(0)
	if err != nil {
		return nil, err
	}
	h0, nkv := 0, Hkv // the KV heads the node reads (op set v4: a range of k's)
	if n.iattr[3] != 0 {
		h0, nkv = int(n.iattr[2]), int(n.iattr[3])
	}
	group := Hq / nkv
	keys := make([]int, 0, seen)
	w := make([]float64, seen)
	for i := 0; i < Tq; i++ {
		keys = vis.keys(i, keys[:0])
		nv := len(keys)
		for h := 0; h < Hq; h++ {
			hk := h0 + h/group
			qv := qf[(i*Hq+h)*D:][:D]
			for x, j := range keys {
				w[x] = scale * floats.Dot(qv, kf[(j*Hkv+hk)*D:][:D])
				if softCap > 0 {
					w[x] = softCap * math.Tanh(w[x]/softCap)
				}
			}
			softmaxPrefix(w[:nv], nv, 1)
			o := res[(i*Hq+h)*Dv:][:Dv]
			for x, j := range keys {
				floats.AddScaled(o, w[x], vf[(j*Hkv+hk)*Dv:][:Dv])
			}
		}
	}
	return encode(out.dt, res)
}

// attnVisibility is OPS.md's rule for which keys a query sees: all of them (not causal), the
// causal prefix j <= i+off (within the last window keys when window > 0), or, with a tree mask,
// every key before off plus the block keys off+j the mask row marks. Keys outside [0, tk) never
// exist.
type attnVisibility struct {
	causal      bool
	off, tq, tk int64
	mask        []byte // i8 [tq, tq], or nil
	window      int64  // 0: none
}

// keys appends the keys query i sees, ascending.
func (a attnVisibility) keys(i int, dst []int) []int {
	if !a.causal {
		for j := 0; j < int(a.tk); j++ {
			dst = append(dst, j)
		}
		return dst
	}
	if a.mask == nil {
		first := int64(0)
		if a.window > 0 {
			first = max(0, int64(i)+a.off-a.window+1)
		}
		for j := first; j < min(int64(i)+a.off+1, a.tk); j++ {
			dst = append(dst, int(j))
		}
		return dst
	}
	for j := int64(0); j < min(a.off, a.tk); j++ {
		dst = append(dst, int(j))
	}
	row := a.mask[int64(i)*a.tq:][:a.tq]
	for j, m := range row {
		if key := a.off + int64(j); m != 0 && key >= 0 && key < a.tk {
			dst = append(dst, int(key))
		}
	}
	return dst
}

// rowsRead is one past the last key any query sees: the rows of K and V that may be decoded.
func (a attnVisibility) rowsRead() int {
	last := int64(-1)
	switch {
	case !a.causal:
		last = a.tk - 1
	case a.mask == nil:
		last = a.tq - 1 + a.off
	default:
		last = a.off - 1
		for j := a.tq - 1; j >= 0; j-- {
			used := false
			for i := int64(0); i < a.tq && !used; i++ {
				used = a.mask[i*a.tq+j] != 0
			}
			if used {
				last = a.off + j
				break
			}
		}
	}
	return int(min(max(last+1, 0), a.tk))
}

// decodeRows decodes the first rows rows of a [T, H, D] float or Q8_0/Q4_0 tensor, and nothing
// past them.
func decodeRows(x value, rows int) ([]float64, error) {
	if !x.dt.Float() && x.dt != core.Q8_0 && x.dt != core.Q4_0 {
		return nil, fmt.Errorf("%s k/v: %w", x.dt, core.ErrInvalidArgument)
	}
	rowBytes := int(x.dt.Bytes(x.shape[1] * x.shape[2]))
	return value{dt: x.dt, shape: core.Shape{int64(rows), x.shape[1], x.shape[2]}, b: x.b[:rows*rowBytes]}.floats(0)
}
