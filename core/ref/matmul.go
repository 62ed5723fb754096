package ref

import (
	"gonum.org/v1/gonum/mat"

	"github.com/xpuhub/xpu/core"
)

// evalMatMul is out[..., m, n] = Σ_k a[..., m, k] · b[..., n, k], batch dims broadcast.
func evalMatMul(n *nodeInfo, in []value, out tensorInfo) ([]byte, error) {
	a, err := in[0].floats(0)
	if err != nil {
		return nil, err
	}
	b, err := in[1].floats(n.fattr[0]) // the I8 scale; ignored by other dtypes
	if err != nil {
		return nil, err
	}
	as, bs := in[0].shape, in[1].shape
	if len(as) == 1 {
		as = core.Shape{1, as[0]} // [K] is [1, K] and gives [N]
	}
	M, K := int(as[len(as)-2]), int(as[len(as)-1])
	N := int(bs[len(bs)-2])
	var batch core.Shape // nil for a rank-1 a: one product
	if len(in[0].shape) > 1 {
		batch = out.shape[:len(out.shape)-2]
	}
	res := make([]float64, out.shape.NumElements())
	if M == 0 || N == 0 || len(res) == 0 || K == 0 {
		return encode(out.dt, res) // an empty sum is 0
	}
	// Element strides of whole matrices along the batch axes (0 where broadcast).
	sa := broadcastStrides(as[:len(as)-2], batch)
	sb := broadcastStrides(bs[:len(bs)-2], batch)
	idx := make([]int, len(batch))
	for i := 0; i < int(batch.NumElements()); i++ {
		unravel(i, batch, idx)
		ao, bo := dot(idx, sa)*M*K, dot(idx, sb)*N*K
		am := mat.NewDense(M, K, a[ao:ao+M*K])
		bm := mat.NewDense(N, K, b[bo:bo+N*K])
		om := mat.NewDense(M, N, res[i*M*N:(i+1)*M*N])
		om.Mul(am, bm.T())
	}
	return encode(out.dt, res)
}
