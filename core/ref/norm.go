package ref

import (
	"math"

	"gonum.org/v1/gonum/floats"

	"github.com/xpuhub/xpu/core"
)

// rows splits xs into consecutive rows of length k (none when k is 0).
func rows(xs []float64, k int) [][]float64 {
	if k == 0 {
		return nil
	}
	out := make([][]float64, 0, len(xs)/k)
	for i := 0; i+k <= len(xs); i += k {
		out = append(out, xs[i:i+k])
	}
	return out
}

// evalNorm is RMS_NORM and LAYER_NORM over the last axis.
func evalNorm(n *nodeInfo, x value) ([]byte, error) {
	xs, err := x.floats(0)
	if err != nil {
		return nil, err
	}
	eps := float64(n.fattr[0])
	k := int(x.shape[len(x.shape)-1])
	for _, r := range rows(xs, k) {
		if n.op == core.OpLayerNorm {
			mean := floats.Sum(r) / float64(k)
			floats.AddConst(-mean, r)
		}
		ms := floats.Dot(r, r) / float64(k)
		floats.Scale(1/math.Sqrt(ms+eps), r)
	}
	return encode(x.dt, xs)
}

// evalSoftmax is SOFTMAX over the last axis with scale and the optional causal mask.
func evalSoftmax(n *nodeInfo, x value) ([]byte, error) {
	xs, err := x.floats(0)
	if err != nil {
		return nil, err
	}
	scale := float64(n.fattr[0])
	if scale == 0 {
		scale = 1
	}
	causal, offset := n.iattr[0] != 0, n.iattr[1]
	nCols := int(x.shape[len(x.shape)-1])
	m := 1
	if len(x.shape) >= 2 {
		m = int(x.shape[len(x.shape)-2])
	}
	for ri, r := range rows(xs, nCols) {
		visible := nCols // columns [0, visible) take part
		if causal {
			i := int64(ri % m) // row index inside its [M, N] matrix
			visible = int(min(max(i+offset+1, 0), int64(nCols)))
		}
		softmaxPrefix(r, visible, scale)
	}
	return encode(x.dt, xs)
}

// softmaxPrefix replaces r with softmax(scale*r[:visible]) followed by zeros; the masked tail is
// never read. A row with nothing visible becomes all zeros.
func softmaxPrefix(r []float64, visible int, scale float64) {
	z := r[:visible]
	if visible > 0 {
		floats.Scale(scale, z)
		mx := floats.Max(z)
		for j := range z {
			z[j] = math.Exp(z[j] - mx)
		}
		floats.Scale(1/floats.Sum(z), z)
	}
	for j := visible; j < len(r); j++ {
		r[j] = 0
	}
}
