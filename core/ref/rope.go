package ref

import (
	"math"

	"github.com/xpuhub/xpu/core"
)

// evalRoPE rotates the first n_rot dims of every head of x [T,H,D] or [B,T,H,D] by its
// position; the other dims are copied.
func evalRoPE(n *nodeInfo, in []value) ([]byte, error) {
	x := in[0]
	xs, err := x.floats(0)
	if err != nil {
		return nil, err
	}
	pos := in[1].ints()
	r := len(x.shape)
	T, H, D := int(x.shape[r-3]), int(x.shape[r-2]), int(x.shape[r-1])
	nrot := int(n.iattr[1])
	if nrot == 0 {
		nrot = D
	}
	base, fs := float64(n.fattr[0]), float64(n.fattr[1])
	if base == 0 {
		base = 10000
	}
	if fs == 0 {
		fs = 1
	}
	neox := n.iattr[0] == core.RoPENeoX
	B := 1
	if r == 4 {
		B = int(x.shape[0])
	}
	for b := 0; b < B; b++ {
		for t := 0; t < T; t++ {
			p := float64(pos[t])
			for h := 0; h < H; h++ {
				head := xs[((b*T+t)*H+h)*D:][:D]
				for i := 0; i < nrot/2; i++ {
					theta := p * fs * math.Pow(base, -2*float64(i)/float64(nrot))
					sin, cos := math.Sincos(theta)
					u, v := 2*i, 2*i+1
					if neox {
						u, v = i, i+nrot/2
					}
					hu, hv := head[u], head[v]
					head[u] = hu*cos - hv*sin
					head[v] = hu*sin + hv*cos
				}
			}
		}
	}
	return encode(x.dt, xs)
}
