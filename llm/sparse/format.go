// Package sparse is the offline half of the sparse FFN (PowerInfer-2): the sidecar
// format that holds a ReLU-family model's FFN neurons in bundles ordered hot-first, the plan
// (how many neurons per layer stay resident) and the per-layer activation predictors; the
// profiler, predictor training and planner that write it; and the Predictor interface the
// runtime asks which neurons a token will use (the trained predictor, or Oracle for tests).
//
// # Sidecar format (version 1)
//
// A GGUF v3 file, by default "<model>.sparse.gguf", with general.alignment = 4096 so every
// tensor's data (and so every layer's bundle matrix) starts 4 KiB-aligned for direct reads.
// Metadata:
//
//	xpu.sparse.version        u32     1
//	xpu.sparse.model_hash     string  ModelHash of the model it was planned for
//	xpu.sparse.activation     string  "relu" | "relu2"
//	xpu.sparse.gated          bool    bundles hold gate | up | down (true) or up | down
//	xpu.sparse.budget_bytes   u64     the memory budget the plan was sized for
//	xpu.sparse.hot_counts     u32[L]  per layer: bundle rows [0, hot) are the hot cluster
//	xpu.sparse.pred_rank      u32     r, the predictors' rank
//	xpu.sparse.pred_threshold f32     a neuron is predicted active when its logit > threshold
//	                                  (plan-sparse folds each layer's threshold into pred_bias
//	                                  and writes 0)
//	xpu.sparse.pred_recall    f32[L]  per layer, measured on held-out calibration tokens
//	xpu.sparse.pred_precision f32[L]  idem
//	xpu.sparse.calib_tokens   u32     tokens profiled
//
// Tensors, per layer N (F neurons, model dim D):
//
//	blk.N.ffn_bundle  [F, R]  the model's FFN dtype (F32, F16, Q8_0, Q4_0); row i is neuron
//	                          ffn_order[i]: gate row | up row | down column, R = 3D (2D ungated),
//	                          SPARSE_FFN's bundle layout (abi/OPS.md)
//	blk.N.ffn_order   I32 [F] bundle row → the neuron's index in the model
//	blk.N.ffn_freq    F32 [F] measured activation frequency of each bundle row (descending)
//	blk.N.pred_a      F16 [r, D]
//	blk.N.pred_b      F16 [F, r]  rows in bundle order
//	blk.N.pred_bias   F32 [F]     logits = pred_b · relu(pred_a · x) + pred_bias,
//	                              x = the FFN input (after ffn_norm)
//
// The last three keys are additions of ours beyond the agreed list; readers ignore unknown keys.
//
// F32 and F16 bundles are exact copies of the model's values. For Q8_0 and Q4_0 the gate and
// up rows are the model's blocks byte for byte, but the down column is requantized along D (the
// model's down matrix is quantized along F), which changes its values by up to one
// quantization step: sparse output then differs slightly from dense, so tests that demand
// equality with dense decoding use F32/F16 models.
package sparse

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
)

// Version is the sidecar format version this package reads and writes.
const Version = 1

// Alignment is the sidecar's general.alignment: each tensor starts on a 4 KiB boundary.
const Alignment = 4096

// Metadata keys.
const (
	KeyVersion       = "xpu.sparse.version"
	KeyModelHash     = "xpu.sparse.model_hash"
	KeyActivation    = "xpu.sparse.activation"
	KeyGated         = "xpu.sparse.gated"
	KeyBudget        = "xpu.sparse.budget_bytes"
	KeyHotCounts     = "xpu.sparse.hot_counts"
	KeyPredRank      = "xpu.sparse.pred_rank"
	KeyPredThreshold = "xpu.sparse.pred_threshold"
	KeyPredRecall    = "xpu.sparse.pred_recall"
	KeyPredPrecision = "xpu.sparse.pred_precision"
	KeyCalibTokens   = "xpu.sparse.calib_tokens"
)

// Sentinel errors, for errors.Is.
var (
	// ErrMismatch: the sidecar was planned for another model (hash, layer count or shapes).
	ErrMismatch = errors.New("sparse: sidecar does not match the model")
	// ErrFormat: the sidecar is malformed or truncated.
	ErrFormat = errors.New("sparse: malformed sidecar")
)

// hashSpan is how much tensor data at each end of the model the hash covers.
const hashSpan = 1 << 20

// ModelHash identifies a model file cheaply: the hex SHA-256 over its bytes [0, data offset)
// (header, metadata, tensor infos), its size as 8 little-endian bytes, and the first and last
// 1 MiB of its tensor data (fewer when the data section is smaller; the spans may overlap).
func ModelHash(f *gguf.File) (string, error) {
	b := f.Bytes()
	if b == nil {
		return "", fmt.Errorf("sparse: model file is closed: %w", core.ErrInvalidArgument)
	}
	n := int64(len(b))
	off := f.DataOffset
	if off > n {
		off = n
	}
	h := sha256.New()
	h.Write(b[:off])
	var sz [8]byte
	binary.LittleEndian.PutUint64(sz[:], uint64(n))
	h.Write(sz[:])
	h.Write(b[off:min(n, off+hashSpan)])
	h.Write(b[max(off, n-hashSpan):])
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Activation names of the sidecar (the ReLU family only: a SiLU FFN is not sparse).
const (
	ActReLU  = "relu"
	ActReLU2 = "relu2"
)

// Meta is the sidecar's metadata.
type Meta struct {
	ModelHash     string
	Activation    string // ActReLU or ActReLU2
	Gated         bool
	BudgetBytes   uint64
	HotCounts     []int // per layer
	PredRank      int
	PredThreshold float32
	// Recall and Precision are per layer, measured on held-out tokens (0 when not measured).
	Recall, Precision []float32
	CalibTokens       int
}

// Layer is one layer's content to write.
type Layer struct {
	// Bundle is [F, R] in BundleType, row i = neuron Order[i]; Gen may produce it lazily
	// instead (called once when the writer reaches it), so a 7B plan never holds every
	// layer's bundles in memory.
	Bundle    []byte
	BundleGen func() ([]byte, error)
	Order     []int32   // [F]
	Freq      []float32 // [F]
	PredA     []float32 // [r, D], stored as F16
	PredB     []float32 // [F, r], rows in bundle order, stored as F16
	PredBias  []float32 // [F]
}

// Plan is a whole sidecar to write.
type Plan struct {
	Meta
	D, F       int
	BundleType core.DType // F32, F16, Q8_0 or Q4_0
	Layers     []Layer
}

// BundleWidth is R, the values per bundle row: 3D gated, 2D not.
func BundleWidth(d int, gated bool) int {
	if gated {
		return 3 * d
	}
	return 2 * d
}

func (p *Plan) check() error {
	L := len(p.Layers)
	switch {
	case p.Activation != ActReLU && p.Activation != ActReLU2:
		return fmt.Errorf("sparse: activation %q (relu, relu2): %w", p.Activation, core.ErrInvalidArgument)
	case L == 0 || p.D <= 0 || p.F <= 0 || p.PredRank <= 0:
		return fmt.Errorf("sparse: empty plan (%d layers, D %d, F %d, rank %d): %w", L, p.D, p.F, p.PredRank, core.ErrInvalidArgument)
	case len(p.HotCounts) != L:
		return fmt.Errorf("sparse: %d hot counts for %d layers: %w", len(p.HotCounts), L, core.ErrInvalidArgument)
	case len(p.Recall) != L || len(p.Precision) != L:
		return fmt.Errorf("sparse: recall/precision need one value per layer (%d): %w", L, core.ErrInvalidArgument)
	case len(p.ModelHash) != 64:
		return fmt.Errorf("sparse: model hash %q is not a hex SHA-256: %w", p.ModelHash, core.ErrInvalidArgument)
	}
	switch p.BundleType {
	case core.F32, core.F16, core.Q8_0, core.Q4_0:
	default:
		return fmt.Errorf("sparse: bundle dtype %s (F32, F16, Q8_0, Q4_0): %w", p.BundleType, core.ErrUnsupported)
	}
	if int64(p.D)%p.BundleType.BlockLen() != 0 {
		return fmt.Errorf("sparse: dim %d is not a multiple of the %s block: %w", p.D, p.BundleType, core.ErrInvalidArgument)
	}
	r := p.PredRank
	for l, ly := range p.Layers {
		if p.HotCounts[l] < 0 || p.HotCounts[l] > p.F {
			return fmt.Errorf("sparse: layer %d: hot count %d outside [0, %d]: %w", l, p.HotCounts[l], p.F, core.ErrInvalidArgument)
		}
		if len(ly.Order) != p.F || len(ly.Freq) != p.F || len(ly.PredA) != r*p.D || len(ly.PredB) != p.F*r || len(ly.PredBias) != p.F {
			return fmt.Errorf("sparse: layer %d: order %d, freq %d, pred_a %d, pred_b %d, bias %d values for F %d, D %d, rank %d: %w",
				l, len(ly.Order), len(ly.Freq), len(ly.PredA), len(ly.PredB), len(ly.PredBias), p.F, p.D, r, core.ErrInvalidArgument)
		}
		if err := checkPermutation(ly.Order, p.F); err != nil {
			return fmt.Errorf("sparse: layer %d: %w", l, err)
		}
		if ly.Bundle == nil && ly.BundleGen == nil {
			return fmt.Errorf("sparse: layer %d has no bundle: %w", l, core.ErrInvalidArgument)
		}
	}
	return nil
}

// checkPermutation: order must name every neuron of [0, f) exactly once.
func checkPermutation(order []int32, f int) error {
	seen := make([]bool, f)
	for i, n := range order {
		if n < 0 || int(n) >= f || seen[n] {
			return fmt.Errorf("ffn_order[%d] = %d is not part of a permutation of [0, %d): %w", i, n, f, ErrFormat)
		}
		seen[n] = true
	}
	return nil
}

func f16Bytes(xs []float32) []byte {
	b, _ := core.Quantize(core.F16, xs, 0) // F16 conversion cannot fail
	return b
}

// Write writes the sidecar.
func Write(w io.Writer, p *Plan) error {
	if err := p.check(); err != nil {
		return err
	}
	L := len(p.Layers)
	hot := make([]uint32, L)
	for l, h := range p.HotCounts {
		hot[l] = uint32(h)
	}
	kvs := []gguf.KeyValue{
		{Key: "general.architecture", Value: gguf.MustValue("xpu-sparse")},
		{Key: "general.alignment", Value: gguf.MustValue(uint32(Alignment))},
		{Key: KeyVersion, Value: gguf.MustValue(uint32(Version))},
		{Key: KeyModelHash, Value: gguf.MustValue(p.ModelHash)},
		{Key: KeyActivation, Value: gguf.MustValue(p.Activation)},
		{Key: KeyGated, Value: gguf.MustValue(p.Gated)},
		{Key: KeyBudget, Value: gguf.MustValue(p.BudgetBytes)},
		{Key: KeyHotCounts, Value: gguf.MustValue(hot)},
		{Key: KeyPredRank, Value: gguf.MustValue(uint32(p.PredRank))},
		{Key: KeyPredThreshold, Value: gguf.MustValue(p.PredThreshold)},
		{Key: KeyPredRecall, Value: gguf.MustValue(append([]float32(nil), p.Recall...))},
		{Key: KeyPredPrecision, Value: gguf.MustValue(append([]float32(nil), p.Precision...))},
		{Key: KeyCalibTokens, Value: gguf.MustValue(uint32(p.CalibTokens))},
	}
	F, D, r := int64(p.F), int64(p.D), int64(p.PredRank)
	R := int64(BundleWidth(p.D, p.Gated))
	var ts []gguf.WriteTensor
	for l := range p.Layers {
		ly := &p.Layers[l]
		pre := fmt.Sprintf("blk.%d.", l)
		ts = append(ts,
			gguf.WriteTensor{Name: pre + "ffn_bundle", DType: p.BundleType, Shape: core.Shape{F, R}, Data: ly.Bundle, Gen: ly.BundleGen},
			gguf.WriteTensor{Name: pre + "ffn_order", DType: core.I32, Shape: core.Shape{F}, Data: core.EncodeI32(ly.Order)},
			gguf.WriteTensor{Name: pre + "ffn_freq", DType: core.F32, Shape: core.Shape{F}, Data: core.EncodeF32(ly.Freq)},
			gguf.WriteTensor{Name: pre + "pred_a", DType: core.F16, Shape: core.Shape{r, D}, Data: f16Bytes(ly.PredA)},
			gguf.WriteTensor{Name: pre + "pred_b", DType: core.F16, Shape: core.Shape{F, r}, Data: f16Bytes(ly.PredB)},
			gguf.WriteTensor{Name: pre + "pred_bias", DType: core.F32, Shape: core.Shape{F}, Data: core.EncodeF32(ly.PredBias)},
		)
	}
	if err := gguf.Write(w, kvs, ts); err != nil {
		return fmt.Errorf("sparse: writing the sidecar: %w", err)
	}
	return nil
}

// WriteFile writes the sidecar to path (through a temporary file, so a failed or interrupted
// write never leaves a sidecar that looks valid).
func WriteFile(path string, p *Plan) error {
	tmp, err := os.CreateTemp(dirOf(path), ".sparse-*.tmp")
	if err != nil {
		return fmt.Errorf("sparse: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := Write(tmp, p); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("sparse: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("sparse: %w", err)
	}
	return nil
}

// DefaultPath is the sidecar's default location next to the model.
func DefaultPath(model string) string { return model + ".sparse.gguf" }
