package ref

import (
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
)

// Op set 3: MATMUL with an I8 activation or per-channel weight scales, and SHADOW_MATMUL
// (abi/OPS.md "Int8 activations (v3)" and "SHADOW_MATMUL").

// channelScales returns the weight scale of each of the N output channels: fattr[0] for all, or
// the F32 3rd input, whose values are checked here because an input's are known only now.
func channelScales(n *nodeInfo, in []value, N int) ([]float64, error) {
	sb := make([]float64, N)
	if len(in) < 3 {
		for i := range sb {
			sb[i] = float64(n.fattr[0])
		}
		return sb, nil
	}
	for i, s := range core.DecodeF32(in[2].b) {
		if !(s > 0) || math.IsInf(float64(s), 0) {
			return nil, fmt.Errorf("per-channel scale %d is %g, must be positive and finite: %w", i, s, core.ErrInvalidArgument)
		}
		sb[i] = float64(s)
	}
	return sb, nil
}

// evalMatMulI8B is MATMUL with an I8 b [N, K] whose scales may be per channel, and an I8 or
// float a [..., M, K] (or [K]); b has no batch dims, so a's leading dims are just more rows.
// An I8 a sums exact integer products, then scales (and puts the result on the 16-bit grid
// when fattr[2] > 0).
func evalMatMulI8B(n *nodeInfo, in []value, out tensorInfo) ([]byte, error) {
	a, b := in[0], in[1]
	N, K := int(b.shape[0]), int(b.shape[1])
	rows := int(a.shape[:len(a.shape)-1].NumElements())
	sb, err := channelScales(n, in, N)
	if err != nil {
		return nil, err
	}
	res := make([]float64, rows*N)
	if a.dt != core.I8 {
		af, err := a.floats(0)
		if err != nil {
			return nil, err
		}
		for r := 0; r < rows; r++ {
			for j := 0; j < N; j++ {
				var acc float64
				for k := 0; k < K; k++ {
					acc += af[r*K+k] * float64(int8(b.b[j*K+k]))
				}
				res[r*N+j] = acc * sb[j]
			}
		}
		return encode(out.dt, res)
	}
	sa, so := float64(n.fattr[1]), float64(n.fattr[2])
	for r := 0; r < rows; r++ {
		qa := a.b[r*K : (r+1)*K]
		for j := 0; j < N; j++ {
			qb := b.b[j*K : (j+1)*K]
			var acc int64
			for k := range qa {
				acc += int64(int8(qa[k])) * int64(int8(qb[k]))
			}
			v := float64(acc) * sa * sb[j]
			if so > 0 {
				v = so * math.Max(-32767, math.Min(32767, math.Round(v/so)))
			}
			res[r*N+j] = v
		}
	}
	return encode(out.dt, res)
}

// evalShadowMatMul is out[m, n] = Σ_c e(x[m, ids[c]]) · wt[c, n] with e(v) = v − clamp(v, −t, t).
// Only the (m, c) with e ≠ 0 are visited (NaN counts as an outlier and propagates).
func evalShadowMatMul(n *nodeInfo, in []value, out tensorInfo) ([]byte, error) {
	x, wt, err := floats2(in)
	if err != nil {
		return nil, err
	}
	K := int(in[0].shape[len(in[0].shape)-1])
	C, N := int(in[1].shape[0]), int(in[1].shape[1])
	ids := make([]int, C)
	for c := range ids {
		ids[c] = c
	}
	if len(in) == 3 {
		for c, id := range in[2].ints() {
			if id < 0 || int(id) >= K {
				return nil, fmt.Errorf("id %d at position %d is outside the %d input channels: %w", id, c, K, core.ErrInvalidArgument)
			}
			ids[c] = int(id)
		}
	}
	t := float64(n.fattr[0])
	M := 1
	if len(in[0].shape) == 2 {
		M = int(in[0].shape[0])
	}
	res := make([]float64, M*N)
	for m := 0; m < M; m++ {
		row := res[m*N : (m+1)*N]
		for c, id := range ids {
			v := x[m*K+id]
			e := v - math.Max(-t, math.Min(t, v))
			if e == 0 {
				continue
			}
			w := wt[c*N : (c+1)*N]
			for j := range row {
				row[j] += e * w[j]
			}
		}
	}
	return encode(out.dt, res)
}
