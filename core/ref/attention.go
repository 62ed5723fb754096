package ref

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/floats"

	"github.com/xpuhub/xpu/core"
)

// evalAttention is fused grouped-query attention. It decodes only the K and V rows some query
// can see: a KV cache bound at full capacity holds garbage (even NaN) past its valid length.
func evalAttention(n *nodeInfo, in []value, out tensorInfo) ([]byte, error) {
	q, k, v := in[0], in[1], in[2]
	Tq, Hq, D := int(q.shape[0]), int(q.shape[1]), int(q.shape[2])
	Tk, Hkv, Dv := int(k.shape[0]), int(k.shape[1]), int(v.shape[2])
	causal := n.iattr[0] != 0
	off := n.iattr[1]
	if len(in) == 4 {
		off = int64(in[3].ints()[0])
	}
	scale := float64(n.fattr[0])
	if scale == 0 && D > 0 {
		scale = 1 / math.Sqrt(float64(D))
	}
	// visible(i) keys [0, visible(i)) are seen by query i.
	visible := func(i int) int {
		if !causal {
			return Tk
		}
		return int(min(max(int64(i)+off+1, 0), int64(Tk)))
	}
	res := make([]float64, out.shape.NumElements())
	if len(res) == 0 || Tq == 0 {
		return encode(out.dt, res)
	}
	seen := visible(Tq - 1) // the last query sees the most
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
	group := Hq / Hkv
	w := make([]float64, seen)
	for i := 0; i < Tq; i++ {
		nv := visible(i)
		for h := 0; h < Hq; h++ {
			hk := h / group
			qv := qf[(i*Hq+h)*D:][:D]
			for j := 0; j < nv; j++ {
				w[j] = floats.Dot(qv, kf[(j*Hkv+hk)*D:][:D])
			}
			softmaxPrefix(w[:nv], nv, scale)
			o := res[(i*Hq+h)*Dv:][:Dv]
			for j := 0; j < nv; j++ {
				floats.AddScaled(o, w[j], vf[(j*Hkv+hk)*Dv:][:Dv])
			}
		}
	}
	return encode(out.dt, res)
}

// decodeRows decodes the first rows rows of a [T, H, D] float tensor, and nothing past them.
func decodeRows(x value, rows int) ([]float64, error) {
	if !x.dt.Float() {
		return nil, fmt.Errorf("%s k/v: %w", x.dt, core.ErrInvalidArgument)
	}
	rowBytes := int(x.dt.Bytes(x.shape[1] * x.shape[2]))
	return value{dt: x.dt, shape: core.Shape{int64(rows), x.shape[1], x.shape[2]}, b: x.b[:rows*rowBytes]}.floats(0)
}
