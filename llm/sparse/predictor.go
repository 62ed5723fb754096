package sparse

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// Predictor says which neurons of a layer a token will use. Implementations are safe for
// concurrent use.
type Predictor interface {
	// Predict appends to dst the bundle rows (indices into the sidecar's hot-first order) of
	// layer predicted active for the FFN input x (D values, after ffn_norm) and returns it.
	Predict(layer int, x []float32, dst []int32) []int32
}

// TrainedLayer is one layer's low-rank predictor: logits = B · relu(A · x) + Bias.
type TrainedLayer struct {
	A    []float32 // [Rank, D]
	B    []float32 // [F, Rank], rows in bundle order
	Bias []float32 // [F]
}

// Trained is the trained low-rank predictor of every layer (what plan-sparse writes).
type Trained struct {
	D, F, Rank int
	Threshold  float32
	Layers     []TrainedLayer
}

// Logits computes layer's F logits for x into out (len F) and returns it.
func (t *Trained) Logits(layer int, x, out []float32) []float32 {
	ly := &t.Layers[layer]
	h := make([]float32, t.Rank)
	for j := 0; j < t.Rank; j++ {
		h[j] = max(0, dot(ly.A[j*t.D:(j+1)*t.D], x))
	}
	if cap(out) < t.F {
		out = make([]float32, t.F)
	}
	out = out[:t.F]
	for i := 0; i < t.F; i++ {
		out[i] = dot(ly.B[i*t.Rank:(i+1)*t.Rank], h) + ly.Bias[i]
	}
	return out
}

// Predict implements Predictor: the rows whose logit exceeds Threshold.
func (t *Trained) Predict(layer int, x []float32, dst []int32) []int32 {
	lg := t.Logits(layer, x, nil)
	for i, v := range lg {
		if v > t.Threshold {
			dst = append(dst, int32(i))
		}
	}
	return dst
}

// Oracle predicts exactly the truly active neurons: those whose gate pre-activation (gate row ·
// x, computed in float32 from the sidecar's bundles) exceeds -Margin. It is the reference a
// sparse decode must match dense decoding with (the oracle test); Margin > 0 also keeps
// neurons whose gate is a rounding error away from 0, where the runtime's own arithmetic might
// land on the other side.
type Oracle struct {
	D, F   int
	Margin float32
	gates  [][]float32 // per layer [F, D], bundle order
}

// NewOracle decodes every layer's gate rows (the first D values of each bundle row: the up row
// for an ungated FFN) from s. Memory is L·F·D floats: meant for test-sized models.
func NewOracle(s *Sidecar, margin float32) (*Oracle, error) {
	o := &Oracle{D: s.D, F: s.F, Margin: margin}
	segBytes := s.BundleType.Bytes(int64(s.D))
	for l := 0; l < s.Layers(); l++ {
		b := s.Bundle(l)
		g := make([]float32, 0, s.F*s.D)
		for i := 0; i < s.F; i++ {
			row := b[int64(i)*s.RowBytes : int64(i)*s.RowBytes+segBytes]
			xs, err := core.Dequantize(s.BundleType, row, 0)
			if err != nil {
				return nil, fmt.Errorf("sparse: oracle, layer %d row %d: %w", l, i, err)
			}
			g = append(g, xs...)
		}
		o.gates = append(o.gates, g)
	}
	return o, nil
}

// Predict implements Predictor.
func (o *Oracle) Predict(layer int, x []float32, dst []int32) []int32 {
	g := o.gates[layer]
	for i := 0; i < o.F; i++ {
		if dot(g[i*o.D:(i+1)*o.D], x) > -o.Margin {
			dst = append(dst, int32(i))
		}
	}
	return dst
}

// dot is a float32 dot product with four accumulators (the profiler's and predictors' inner
// loop).
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}
