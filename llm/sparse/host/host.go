// Package host is the contract between a runner that runs a sparse FFN (sparse.WithFFN)
// and the host half that keeps its bundle cache filled (llm/sparse): a package of its own so
// that neither imports the other.
package host

import (
	"context"

	"github.com/xpuhub/xpu/core"
)

// FFN is the host half of a sparse FFN (PowerInfer-2): sparse.WithFFN hands one
// to a runner, which then never touches the model's dense FFN weights. Every layer's FFN runs
// as SPARSE_FFN over a bundle cache the runner allocates in its arena (Rows rows of the
// layout's bundles, shared by all layers); the FFN decides, per layer and chunk, which
// cache rows the FFN uses and keeps the cache filled (resident hot bundles, cold ones read from
// storage on demand). llm/sparse implements it over a sidecar.
//
// Per layer and chunk the runner runs three graphs: attention and the FFN input h (with the
// layer's predictor logits when the layout has predictors), then SPARSE_FFN over the rows
// Select put in now (the bundles already resident: they compute while the others load), then,
// after wait returns, SPARSE_FFN over later (the bundles being loaded) with the residual and the
// next layer's projections.
type FFN interface {
	// Layout describes the cache and the layers' predictors; it must not change.
	Layout() Layout
	// Load fills what stays resident into cache (Rows × the bytes of one row) before the first
	// run. cache stays valid, and is the FFN's to write between runs, until the runner
	// closes.
	Load(ctx context.Context, cache []byte) error
	// Select is called after layer l's attention for a chunk of c tokens with the FFN input h
	// ([c, D] floats), the predictor logits ([c, Neurons], nil without predictors) and, with
	// Layout().LookAhead, layer l+1's predictor logits over the same h (next, [c, Neurons];
	// nil at the last layer or without LookAhead): a guess of the next layer's neurons. It
	// fills now and later (Neurons entries each: cache rows, -1 for an empty slot) and
	// returns wait, which the runner calls before it runs later's rows: it blocks until they
	// are in the cache. Both slices are the runner's and are read only by the next two runs.
	Select(ctx context.Context, l int, h, logits, next []float32, now, later []int32) (wait func() error, err error)
}

// Layout is what the runner builds a sparse model's graphs from.
type Layout struct {
	// DType and RowLen are the bundles' dtype and values per row (R of abi/OPS.md's
	// SPARSE_FFN); Rows is the cache's row count (every layer's hot rows and the cold slots).
	DType  core.DType
	RowLen int64
	Rows   int64
	// Neurons is the FFN width F: the length of the index lists.
	Neurons int
	Act     core.SparseAct
	Ungated bool
	// Predictors, when not empty, holds every layer's low-rank predictor, which the runner
	// computes in the layer's graph: logits = B · relu(A · h) + Bias.
	Predictors []Predictor
	// LookAhead asks the runner to compute layer l+1's predictor over layer l's FFN input in
	// layer l's graph too (Select's next), so the FFN can start reading the next layer's
	// neurons before its attention has run.
	LookAhead bool
	// AllResident says every neuron of every layer is in the cache: Select never fills later,
	// so the runner runs the FFN over now in the layer's last graph and skips a graph per layer.
	AllResident bool
}

// Predictor is one layer's predictor weights, as graph constants.
type Predictor struct {
	Rank int
	A    []byte // F16 [Rank, D]
	B    []byte // F16 [Neurons, Rank]
	Bias []byte // F32 [Neurons]
}
