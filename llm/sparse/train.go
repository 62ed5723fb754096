package sparse

import (
	"math"
	"math/rand/v2"
	"sort"
)

// TrainOptions configure one layer's predictor training.
type TrainOptions struct {
	Rank   int
	Epochs int
	LR     float64
	Seed   uint64
	// Recall is the share of truly active neurons (on the training tokens) that the chosen
	// threshold must keep; the runtime's output error comes from the neurons it misses.
	Recall float64
}

// Quality is a predictor's measured recall and precision on held-out tokens.
type Quality struct {
	Recall, Precision float64
	Predicted, Active int // totals over the held-out tokens
}

// trainLayer fits logits = B·relu(A·x) + bias to the active mask y ([T, F], x [T, D]) with
// class-weighted binary cross-entropy and Adam (full batch), deterministic for a seed. It
// returns the predictor with the recall threshold folded into the bias (a neuron is predicted
// active when its logit > 0), the threshold chosen on the separate tokens xc/yc (Tc of them):
// on the training tokens themselves it would be overfit, and recall on new text falls short.
func trainLayer(x []float32, y []bool, T int, xc []float32, yc []bool, Tc, D, F int, o TrainOptions) TrainedLayer {
	r := o.Rank
	rng := rand.New(rand.NewPCG(o.Seed, 0x7a1))
	A := make([]float32, r*D)
	s := float32(math.Sqrt(2 / float64(D)))
	for i := range A {
		A[i] = float32(rng.NormFloat64()) * s
	}
	B := make([]float32, F*r)
	bs := float32(0.1 / math.Sqrt(float64(r)))
	for i := range B {
		B[i] = float32(rng.NormFloat64()) * bs
	}
	bias := make([]float32, F)
	var pos int
	for f := 0; f < F; f++ {
		n := 0
		for t := 0; t < T; t++ {
			if y[t*F+f] {
				n++
			}
		}
		pos += n
		p := (float64(n) + 0.5) / (float64(T) + 1)
		bias[f] = float32(math.Log(p / (1 - p)))
	}
	// Positives are rare (sparse), and a missed neuron costs accuracy while an extra one only
	// costs time: weight positives by the class ratio, capped.
	wPos := 1.0
	if pos > 0 {
		wPos = min(20, max(1, float64(T*F-pos)/float64(pos)))
	}
	params := [][]float32{A, B, bias}
	grads := [][]float32{make([]float32, len(A)), make([]float32, len(B)), make([]float32, F)}
	m1 := [][]float32{make([]float32, len(A)), make([]float32, len(B)), make([]float32, F)}
	m2 := [][]float32{make([]float32, len(A)), make([]float32, len(B)), make([]float32, F)}
	h := make([]float32, T*r)
	pre := make([]float32, T*r)
	dz := make([]float32, F)
	dh := make([]float32, r)
	const b1, b2, eps = 0.9, 0.999, 1e-8
	for ep := 1; ep <= o.Epochs; ep++ {
		for _, g := range grads {
			clear(g)
		}
		for t := 0; t < T; t++ {
			xt := x[t*D : (t+1)*D]
			for j := 0; j < r; j++ {
				pre[t*r+j] = dot(A[j*D:(j+1)*D], xt)
				h[t*r+j] = max(0, pre[t*r+j])
			}
			ht := h[t*r : (t+1)*r]
			clear(dh)
			for f := 0; f < F; f++ {
				z := dot(B[f*r:(f+1)*r], ht) + bias[f]
				sg := float32(1 / (1 + math.Exp(-float64(z))))
				if y[t*F+f] {
					dz[f] = float32(wPos) * (sg - 1)
				} else {
					dz[f] = sg
				}
				gb := grads[1][f*r : (f+1)*r]
				bf := B[f*r : (f+1)*r]
				for j := 0; j < r; j++ {
					gb[j] += dz[f] * ht[j]
					dh[j] += dz[f] * bf[j]
				}
				grads[2][f] += dz[f]
			}
			for j := 0; j < r; j++ {
				if pre[t*r+j] <= 0 {
					continue
				}
				ga := grads[0][j*D : (j+1)*D]
				for d, v := range xt {
					ga[d] += dh[j] * v
				}
			}
		}
		lr := o.LR * math.Sqrt(1-math.Pow(b2, float64(ep))) / (1 - math.Pow(b1, float64(ep)))
		for k, p := range params {
			g, a, b := grads[k], m1[k], m2[k]
			for i := range p {
				gi := g[i] / float32(T)
				a[i] = b1*a[i] + (1-b1)*gi
				b[i] = b2*b[i] + (1-b2)*gi*gi
				p[i] -= float32(lr * float64(a[i]) / (math.Sqrt(float64(b[i])) + eps))
			}
		}
	}
	ly := TrainedLayer{A: A, B: B, Bias: bias}
	setThreshold(&ly, xc, yc, Tc, D, F, r, o.Recall)
	return ly
}

// setThreshold folds into ly's bias the logit below which only (1 − recall) of the positives of
// xc/yc (Tc tokens) fall, so that a neuron is predicted active when its logit is > 0.
func setThreshold(ly *TrainedLayer, xc []float32, yc []bool, Tc, D, F, r int, recall float64) {
	tr := &Trained{D: D, F: F, Rank: r, Layers: []TrainedLayer{*ly}}
	var posLogits []float32
	lg := make([]float32, F)
	for t := 0; t < Tc; t++ {
		lg = tr.Logits(0, xc[t*D:(t+1)*D], lg)
		for f, v := range lg {
			if yc[t*F+f] {
				posLogits = append(posLogits, v)
			}
		}
	}
	th := float32(0)
	if len(posLogits) > 0 {
		sort.Slice(posLogits, func(a, b int) bool { return posLogits[a] < posLogits[b] })
		k := int(math.Floor((1 - recall) * float64(len(posLogits))))
		th = posLogits[min(k, len(posLogits)-1)] - 1e-4 // strictly below the k-th positive
	}
	for f := range ly.Bias {
		ly.Bias[f] -= th
	}
}

// evaluate measures recall and precision of ly (threshold 0) on x/y.
func evaluate(ly TrainedLayer, x []float32, y []bool, T, D, F, r int) Quality {
	tr := &Trained{D: D, F: F, Rank: r, Layers: []TrainedLayer{ly}}
	var q Quality
	var hit int
	lg := make([]float32, F)
	for t := 0; t < T; t++ {
		lg = tr.Logits(0, x[t*D:(t+1)*D], lg)
		for f, v := range lg {
			p, a := v > 0, y[t*F+f]
			if p {
				q.Predicted++
			}
			if a {
				q.Active++
			}
			if p && a {
				hit++
			}
		}
	}
	q.Recall, q.Precision = 1, 1
	if q.Active > 0 {
		q.Recall = float64(hit) / float64(q.Active)
	}
	if q.Predicted > 0 {
		q.Precision = float64(hit) / float64(q.Predicted)
	}
	return q
}
