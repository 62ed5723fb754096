package ref

import "github.com/xpuhub/xpu/core"

// The data-movement ops copy bytes, so they are bit-exact for every dtype they allow (all of
// which have one element per block).

// evalPermute materializes out[i0..] = x[...] with out.shape[d] = x.shape[perm[d]].
func evalPermute(n *nodeInfo, x value, out tensorInfo) []byte {
	es := int(x.dt.BlockBytes())
	res := make([]byte, len(x.b))
	r := len(x.shape)
	xst := strides(x.shape)
	st := make([]int, r) // x's stride along each output axis
	for d := 0; d < r; d++ {
		st[d] = xst[n.iattr[d]]
	}
	idx := make([]int, r)
	for i := 0; i < x.n(); i++ {
		unravel(i, out.shape, idx)
		src := dot(idx, st)
		copy(res[i*es:(i+1)*es], x.b[src*es:])
	}
	return res
}

// outerInner splits shape s around axis: the element count before it and after it.
func outerInner(s core.Shape, axis int) (outer, inner int) {
	return int(s[:axis].NumElements()), int(s[axis+1:].NumElements())
}

// evalSlice keeps [start, start+out.shape[axis]) of axis.
func evalSlice(n *nodeInfo, x value, out tensorInfo) []byte {
	axis, start := int(n.iattr[0]), int(n.iattr[1])
	es := int(x.dt.BlockBytes())
	outer, inner := outerInner(x.shape, axis)
	src, dst := int(x.shape[axis])*inner*es, int(out.shape[axis])*inner*es
	res := make([]byte, 0, outer*dst)
	for o := 0; o < outer; o++ {
		base := o*src + start*inner*es
		res = append(res, x.b[base:base+dst]...)
	}
	return res
}

// evalConcat joins the inputs along axis iattr[0].
func evalConcat(n *nodeInfo, in []value, out tensorInfo) []byte {
	axis := int(n.iattr[0])
	es := int(out.dt.BlockBytes())
	outer, inner := outerInner(out.shape, axis)
	res := make([]byte, 0, out.bytes())
	for o := 0; o < outer; o++ {
		for _, x := range in {
			chunk := int(x.shape[axis]) * inner * es
			res = append(res, x.b[o*chunk:(o+1)*chunk]...)
		}
	}
	return res
}
