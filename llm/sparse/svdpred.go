package sparse

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"gonum.org/v1/gonum/floats"
	"gonum.org/v1/gonum/mat"
)

// Predictor fitting from the gate weights ("svd", plan-sparse's default).
//
// A neuron fires when its gate pre-activation w_n·x is > 0. The gate matrix of a ReLU LLM is
// close to low rank in the directions the input uses (what Deja Vu's and PowerInfer's
// predictors rely on), so its truncated SVD W ≈ C·V (C [F, k], V [k, D]) predicts w_n·x as
// c_n·(V·x) from k projections of x. Trained from activations instead, a rank-32 predictor of a
// 7B layer has 32·4096 input weights to pin down from the few dozen calibration tokens the Go
// profiler can afford: precision 0.15–0.29 at recall 0.95. The SVD needs no tokens; the tokens
// only set the recall threshold.
//
// The low-rank predictor form B·relu(A·x) + bias has a ReLU inside, so each direction v_j is
// carried twice, A = [V; −V] and B = [C, −C]: relu(a) − relu(−a) = a, exactly. Each row is
// divided by σ_n, the standard deviation of what the truncation leaves out (Σ_d (w_nd −
// ŵ_nd)² E[x_d²], with E[x_d²] measured on the calibration tokens), so a logit is the neuron's
// margin in units of its own prediction error and one global threshold fits every neuron: P(fire)
// is then the same function of the logit for all of them.

// svdIters is the number of power iterations of the randomized SVD: two are enough when the
// spectrum has the gap a low-rank gate has; more would cost a full pass over W each.
const svdIters = 2

// svdOversample is how many directions beyond k the randomized range finder keeps.
const svdOversample = 8

// fitGate fits layer l's rank-r predictor to m's gate weights with x ([T, D], the calibration
// tokens' FFN inputs) for the inputs' second moments, its rows in bundle order (order[i] is the
// neuron of bundle row i). The bias is 0: the caller sets the threshold.
func fitGate(ctx context.Context, m *llm.Model, l int, x []float32, order []int32, rank int, seed uint64) (TrainedLayer, error) {
	D, F := m.Config.Dim, m.Config.FFN
	name := fmt.Sprintf("blk.%d.ffn_gate.weight", l)
	gt, ok := m.File.Tensor(name)
	if !ok {
		return TrainedLayer{}, fmt.Errorf("sparse: tensor %s missing: %w", name, core.ErrNotFound)
	}
	gw, err := core.Dequantize(gt.DType, m.File.TensorData(gt), 0)
	if err != nil {
		return TrainedLayer{}, fmt.Errorf("sparse: %s: %w", name, err)
	}
	if len(gw) != F*D || len(order) != F || len(x)%D != 0 || len(x) == 0 {
		return TrainedLayer{}, fmt.Errorf("sparse: %s holds %d values for [%d, %d], %d neurons ordered, %d input values: %w",
			name, len(gw), F, D, len(order), len(x), core.ErrInvalidArgument)
	}
	pw := make([]float32, F*D)
	for i, n := range order {
		copy(pw[i*D:(i+1)*D], gw[int(n)*D:(int(n)+1)*D])
	}
	T := len(x) / D
	sq := make([]float64, D)
	for t := 0; t < T; t++ {
		for d, v := range x[t*D : (t+1)*D] {
			sq[d] += float64(v) * float64(v) / float64(T)
		}
	}
	return fitSVDLayer(ctx, pw, sq, F, D, rank/2, seed)
}

// fitSVDLayer returns the predictor of one layer from its gate rows w ([F, D], row n =
// neuron n, any order the caller keeps), with rank 2k, and E[x_d²] (sq, D values) of the
// calibration inputs. The bias is 0: the caller sets the threshold.
func fitSVDLayer(ctx context.Context, w []float32, sq []float64, F, D, k int, seed uint64) (TrainedLayer, error) {
	if k < 1 || k > min(F, D) {
		return TrainedLayer{}, fmt.Errorf("sparse: svd predictor of %d directions for a [%d, %d] gate", k, F, D)
	}
	W := mat.NewDense(F, D, nil)
	raw := W.RawMatrix()
	for i, v := range w[:F*D] {
		raw.Data[i] = float64(v)
	}
	l := min(k+svdOversample, min(F, D))
	rng := rand.New(rand.NewPCG(seed, 0x5bd))
	om := mat.NewDense(D, l, nil)
	od := om.RawMatrix().Data
	for i := range od {
		od[i] = rng.NormFloat64()
	}
	var Y, Z mat.Dense
	Y.Mul(W, om)
	orthonormalize(&Y)
	for it := 0; it < svdIters; it++ {
		if err := ctx.Err(); err != nil {
			return TrainedLayer{}, err
		}
		Z.Mul(W.T(), &Y)
		orthonormalize(&Z)
		Y.Mul(W, &Z)
		orthonormalize(&Y)
	}
	var Bm mat.Dense
	Bm.Mul(Y.T(), W) // [l, D]: W ≈ Y·Bm
	var svd mat.SVD
	if !svd.Factorize(&Bm, mat.SVDThin) {
		return TrainedLayer{}, fmt.Errorf("sparse: svd of the gate's [%d, %d] projection did not converge", l, D)
	}
	var Ub, Vb mat.Dense
	svd.UTo(&Ub) // [l, l]
	svd.VTo(&Vb) // [D, l]
	s := svd.Values(nil)
	// C = Y·Ub[:, :k]·diag(s[:k]) [F, k]; V = Vb[:, :k]ᵀ [k, D].
	var C mat.Dense
	C.Mul(&Y, Ub.Slice(0, l, 0, k))
	for j := 0; j < k; j++ {
		col := C.ColView(j).(*mat.VecDense)
		col.ScaleVec(s[j], col)
	}
	V := Vb.Slice(0, D, 0, k).T()
	// What the truncation leaves out, per row, weighted by the inputs' second moments.
	var R mat.Dense
	R.Mul(&C, V)
	R.Sub(W, &R)
	sigma := make([]float64, F)
	var mean float64
	for n := 0; n < F; n++ {
		var s2 float64
		for d, v := range R.RawRowView(n) {
			s2 += v * v * sq[d]
		}
		sigma[n] = math.Sqrt(s2)
		mean += sigma[n]
	}
	// A row the SVD captures exactly would get an infinite scale: floor σ at a small share of
	// the layer's typical one.
	floor := max(1e-6, 1e-3*mean/float64(F))
	r := 2 * k
	ly := TrainedLayer{A: make([]float32, r*D), B: make([]float32, F*r), Bias: make([]float32, F)}
	for j := 0; j < k; j++ {
		for d := 0; d < D; d++ {
			v := float32(V.At(j, d))
			ly.A[j*D+d] = v
			ly.A[(k+j)*D+d] = -v
		}
	}
	for n := 0; n < F; n++ {
		inv := 1 / max(sigma[n], floor)
		for j := 0; j < k; j++ {
			c := float32(C.At(n, j) * inv)
			ly.B[n*r+j] = c
			ly.B[n*r+k+j] = -c
		}
	}
	return ly, nil
}

// orthonormalize replaces the columns of a tall matrix by an orthonormal basis of their span
// (modified Gram-Schmidt, twice: once is not orthogonal enough in floating point when the
// columns are nearly dependent, which the power iterations make them). A column that is
// numerically dependent on the earlier ones becomes 0.
func orthonormalize(m *mat.Dense) {
	_, cols := m.Dims()
	col := make([][]float64, cols)
	for j := range col {
		col[j] = mat.Col(nil, j, m)
	}
	for pass := 0; pass < 2; pass++ {
		for j := range col {
			for i := 0; i < j; i++ {
				d := floats.Dot(col[i], col[j])
				for r := range col[j] {
					col[j][r] -= d * col[i][r]
				}
			}
			n := math.Sqrt(floats.Dot(col[j], col[j]))
			if n < 1e-12 {
				clear(col[j])
				continue
			}
			for r := range col[j] {
				col[j][r] /= n
			}
		}
	}
	for j := range col {
		m.SetCol(j, col[j])
	}
}
