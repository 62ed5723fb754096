package sparse

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/llm/kvcache"
)

// ErrBudget: the memory budget does not hold the fixed region.
var ErrBudget = errors.New("sparse: budget too small")

// PlanOptions configure BuildPlan. Zero values take the defaults named on each field.
type PlanOptions struct {
	Tokens []int32 // calibration tokens (required)
	Budget int64   // bytes the runtime may use (required)
	// Context and KVType size the KV cache of the fixed region (default: the runner's
	// default context, min(model context, 4096), and F32, the largest cache type: a plan
	// sized for it holds for any).
	Context int
	KVType  core.DType
	// Fit is how the predictors are fitted: FitSVD (the default) from the gate weights' truncated
	// SVD, or FitTrain by training on the calibration tokens' activations.
	Fit string
	// Rank is the predictor rank (default 2·min(24, D/8) for FitSVD, which carries each
	// direction twice; min(32, D/4) for FitTrain).
	Rank   int
	Epochs int     // FitTrain's training epochs (default 100)
	LR     float64 // FitTrain's Adam step (default 0.01)
	// Recall is what the threshold keeps on the threshold-setting tokens (default 0.95: the
	// last few percent are neurons barely above 0, which cost the most precision and
	// contribute the least output).
	Recall float64
	// ColdShare is the share of what the fixed region leaves that stays free for the cold
	// neuron cache and the I/O buffers (default 0.25); the rest is the hot clusters.
	ColdShare float64
	Seed      uint64
	// Progress, when set, is told each finished layer of profiling and training.
	Progress func(layer, layers int)
}

// Predictor fits of PlanOptions.Fit.
const (
	FitSVD   = "svd"
	FitTrain = "train"
)

// Fixed is the memory the runtime needs whatever the plan: every weight outside the FFN
// (attention, norms, embeddings, output), the KV cache and the predictors.
type Fixed struct {
	Weights, KV, Predictors int64
}

// Total is the sum.
func (f Fixed) Total() int64 { return f.Weights + f.KV + f.Predictors }

// FixedRegion computes Fixed for m.
func FixedRegion(m *llm.Model, ctxLen int, kv core.DType, rank int) Fixed {
	c := m.Config
	var fx Fixed
	for i := range m.File.Tensors {
		t := &m.File.Tensors[i]
		if isFFNWeight(t.Name) {
			continue
		}
		fx.Weights += t.Size
	}
	fx.KV = 2 * kvcache.Bytes(m.Config, ctxLen, kv) // whole rows: a quantized cache's blocks too
	fx.Predictors = int64(c.Layers) * (2*int64(rank)*int64(c.Dim+c.FFN) + 4*int64(c.FFN))
	return fx
}

// isFFNWeight says whether a tensor is one of the dense FFN matrices, which a sparse runtime
// replaces by the sidecar's bundles (everything else is the fixed region).
func isFFNWeight(name string) bool {
	return strings.Contains(name, ".ffn_gate.") || strings.Contains(name, ".ffn_up.") || strings.Contains(name, ".ffn_down.")
}

// Report is what BuildPlan measured and decided.
type Report struct {
	Fixed      Fixed
	HotBytes   int64 // bytes of the hot clusters
	ColdBytes  int64 // bytes left for the cold cache
	RowBytes   int64
	Tokens     int // calibration tokens, training + held out
	HeldOut    int
	Quality    []Quality // per layer, on held-out tokens
	Sparsity   []float64 // per layer, measured
	HotCounts  []int
	TotalNeurs int
}

// BuildPlan profiles m on the calibration tokens with the Go forward pass, trains each layer's
// predictor on 3 of every 5 tokens, sets its threshold on the fourth and measures it on the
// fifth, orders neurons hot-first and
// sizes the hot clusters to the budget. Bundles are built when the plan is written.
func BuildPlan(ctx context.Context, m *llm.Model, o PlanOptions) (*Plan, Report, error) {
	c := m.Config
	var rep Report
	if !c.Activation.Sparse() {
		return nil, rep, fmt.Errorf("sparse: the model's FFN activation is %s; a sparse plan needs relu or relu2 (%s.%s): %w",
			c.Activation, c.Arch, arch.ActivationKey, core.ErrUnsupported)
	}
	if o.Context == 0 {
		o.Context = min(c.ContextLength, 4096)
	}
	if o.KVType == core.InvalidDType {
		o.KVType = core.F32
	}
	switch o.Fit {
	case "", FitSVD:
		o.Fit = FitSVD
		if o.Rank == 0 {
			o.Rank = 2 * min(24, max(1, c.Dim/8))
		}
		if o.Rank%2 != 0 || o.Rank > 2*min(c.Dim, c.FFN) {
			return nil, rep, fmt.Errorf("sparse: rank %d for the svd fit (an even number up to %d: each direction is carried twice): %w",
				o.Rank, 2*min(c.Dim, c.FFN), core.ErrInvalidArgument)
		}
	case FitTrain:
		if o.Rank == 0 {
			o.Rank = min(32, max(1, c.Dim/4))
		}
	default:
		return nil, rep, fmt.Errorf("sparse: predictor fit %q (%s, %s): %w", o.Fit, FitSVD, FitTrain, core.ErrInvalidArgument)
	}
	if o.Epochs == 0 {
		o.Epochs = 100
	}
	if o.LR == 0 {
		o.LR = 0.01
	}
	if o.Recall == 0 {
		o.Recall = 0.95
	}
	if o.ColdShare == 0 {
		o.ColdShare = 0.25
	}
	if len(o.Tokens) < 5 {
		return nil, rep, fmt.Errorf("sparse: %d calibration tokens (need at least 5): %w", len(o.Tokens), core.ErrInvalidArgument)
	}
	gate, ok := m.File.Tensor("blk.0.ffn_gate.weight")
	if !ok {
		return nil, rep, fmt.Errorf("sparse: no blk.0.ffn_gate.weight: %w", core.ErrUnsupported)
	}
	dt := gate.DType
	rep.RowBytes = dt.Bytes(int64(BundleWidth(c.Dim, true)))
	rep.Fixed = FixedRegion(m, o.Context, o.KVType, o.Rank)
	if o.Budget < rep.Fixed.Total() {
		fx := rep.Fixed
		return nil, rep, fmt.Errorf("%w: budget %s < fixed region %s (non-FFN weights %s + KV cache %s at context %d %s + predictors %s)",
			ErrBudget, mib(o.Budget), mib(fx.Total()), mib(fx.Weights), mib(fx.KV), o.Context, o.KVType, mib(fx.Predictors))
	}
	h, err := ModelHash(m.File)
	if err != nil {
		return nil, rep, err
	}
	T, D, F := len(o.Tokens), c.Dim, c.FFN
	var trainIdx, calIdx, testIdx []int
	for t := 0; t < T; t++ {
		switch t % 5 {
		case 4:
			testIdx = append(testIdx, t)
		case 3:
			calIdx = append(calIdx, t)
		default:
			trainIdx = append(trainIdx, t)
		}
	}
	rep.Tokens, rep.HeldOut = T, len(testIdx)
	// The svd fit trains nothing: every token not held out sets its threshold.
	thIdx := append(append([]int(nil), trainIdx...), calIdx...)
	p := &Plan{Meta: Meta{ModelHash: h, Activation: string(c.Activation), Gated: true, BudgetBytes: uint64(o.Budget),
		PredRank: o.Rank, PredThreshold: 0, CalibTokens: T}, D: D, F: F, BundleType: dt}
	freqs := make([][]float32, c.Layers)
	split := func(idx []int, x []float32, gate []float32) ([]float32, []bool) {
		xs := make([]float32, 0, len(idx)*D)
		ys := make([]bool, 0, len(idx)*F)
		for _, t := range idx {
			xs = append(xs, x[t*D:(t+1)*D]...)
			for _, g := range gate[t*F : (t+1)*F] {
				ys = append(ys, g > 0)
			}
		}
		return xs, ys
	}
	_, err = Forward(ctx, m, o.Tokens, func(l int, x, gate []float32) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		fr := make([]float32, F)
		for i, g := range gate {
			if g > 0 {
				fr[i%F]++
			}
		}
		var act float64
		for i := range fr {
			act += float64(fr[i])
			fr[i] /= float32(T)
		}
		freqs[l] = fr
		rep.Sparsity = append(rep.Sparsity, 1-act/float64(T*F))
		// Hot-first order: descending frequency, ties by index (deterministic).
		order := make([]int32, F)
		for i := range order {
			order[i] = int32(i)
		}
		sort.SliceStable(order, func(a, b int) bool { return fr[order[a]] > fr[order[b]] })
		// Permute gate columns into bundle order before training, so predictor rows are in
		// bundle order.
		pg := make([]float32, len(gate))
		for t := 0; t < T; t++ {
			for i, n := range order {
				pg[t*F+i] = gate[t*F+int(n)]
			}
		}
		xte, yte := split(testIdx, x, pg)
		var ly TrainedLayer
		if o.Fit == FitSVD {
			if ly, err = fitGate(ctx, m, l, x, order, o.Rank, o.Seed^uint64(l)<<32); err != nil {
				return err
			}
			xth, yth := split(thIdx, x, pg)
			setThreshold(&ly, xth, yth, len(thIdx), D, F, o.Rank, o.Recall)
		} else {
			xtr, ytr := split(trainIdx, x, pg)
			xca, yca := split(calIdx, x, pg)
			ly = trainLayer(xtr, ytr, len(trainIdx), xca, yca, len(calIdx), D, F, TrainOptions{Rank: o.Rank, Epochs: o.Epochs, LR: o.LR,
				Seed: o.Seed ^ uint64(l)<<32, Recall: o.Recall})
		}
		q := evaluate(ly, xte, yte, len(testIdx), D, F, o.Rank)
		rep.Quality = append(rep.Quality, q)
		sfr := make([]float32, F)
		for i, n := range order {
			sfr[i] = fr[n]
		}
		layer := l
		p.Layers = append(p.Layers, Layer{Order: order, Freq: sfr, PredA: ly.A, PredB: ly.B, PredBias: ly.Bias,
			BundleGen: func() ([]byte, error) { return BuildBundles(m, layer, order) }})
		p.Recall = append(p.Recall, float32(q.Recall))
		p.Precision = append(p.Precision, float32(q.Precision))
		if o.Progress != nil {
			o.Progress(l+1, c.Layers)
		}
		return nil
	})
	if err != nil {
		return nil, rep, fmt.Errorf("sparse: profiling: %w", err)
	}
	// Hot clusters: the globally most frequent neurons, while their bundles fit what the fixed
	// region and the cold share leave. Within a layer they are a prefix of the bundle order.
	avail := int64(float64(o.Budget-rep.Fixed.Total()) * (1 - o.ColdShare))
	type cand struct {
		l int
		f float32
	}
	all := make([]cand, 0, c.Layers*F)
	for l, ly := range p.Layers {
		for _, f := range ly.Freq {
			all = append(all, cand{l, f})
		}
	}
	sort.SliceStable(all, func(a, b int) bool { return all[a].f > all[b].f })
	p.HotCounts = make([]int, c.Layers)
	n := min(int64(len(all)), avail/rep.RowBytes)
	for _, cd := range all[:n] {
		p.HotCounts[cd.l]++
	}
	rep.HotCounts = p.HotCounts
	rep.HotBytes = n * rep.RowBytes
	rep.ColdBytes = o.Budget - rep.Fixed.Total() - rep.HotBytes
	rep.TotalNeurs = c.Layers * F
	return p, rep, nil
}

// mib formats bytes as MiB.
func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
