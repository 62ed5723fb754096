package sparse

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/gguf"
)

func dirOf(path string) string { return filepath.Dir(path) }

// Sidecar is an opened sidecar. Bundles alias the mapped file (valid until Close); the
// predictors and orders are decoded at open.
type Sidecar struct {
	Meta
	Path       string
	D, F       int
	BundleType core.DType
	// RowBytes is one bundle row's size in bytes; row i of layer l is at file offset
	// BundleOffset(l) + i·RowBytes (for pread of cold neurons).
	RowBytes int64
	File     *gguf.File
	layers   []sideLayer
}

type sideLayer struct {
	bundle *gguf.TensorInfo
	order  []int32
	freq   []float32
	// The predictor as stored: A and B are F16 views of the mapping (what the runner's graphs
	// take as constants, without a copy); Predictor decodes them on demand.
	predA, predB []byte
	bias         []float32
}

// Open opens and validates a sidecar on its own (structure, shapes, orders); OpenFor also
// checks it against the model.
func Open(path string) (*Sidecar, error) {
	f, err := gguf.Open(path)
	if err != nil {
		if errors.Is(err, gguf.ErrFormat) {
			return nil, fmt.Errorf("sparse: sidecar %s is truncated or malformed: %w (%w)", path, ErrFormat, err)
		}
		return nil, fmt.Errorf("sparse: sidecar %s: %w", path, err)
	}
	s, err := FromFile(f)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("sparse: sidecar %s: %w", path, err)
	}
	s.Path = path
	return s, nil
}

// OpenFor opens the sidecar and checks that it was planned for m: same model hash, layer
// count, shapes, activation and FFN dtype; a mismatch is ErrMismatch naming what differs.
func OpenFor(path string, m *llm.Model) (*Sidecar, error) {
	s, err := Open(path)
	if err != nil {
		return nil, err
	}
	if err := s.CheckModel(m); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// CheckModel reports whether s belongs to m.
func (s *Sidecar) CheckModel(m *llm.Model) error {
	h, err := ModelHash(m.File)
	if err != nil {
		return err
	}
	c := m.Config
	switch {
	case h != s.ModelHash:
		return fmt.Errorf("%w: planned for a model with hash %.16s…, this one has %.16s… (re-run xpu plan-sparse)", ErrMismatch, s.ModelHash, h)
	case c.Layers != len(s.layers):
		return fmt.Errorf("%w: %d layers in the sidecar, %d in the model", ErrMismatch, len(s.layers), c.Layers)
	case c.Dim != s.D || c.FFN != s.F:
		return fmt.Errorf("%w: sidecar dim %d ffn %d, model dim %d ffn %d", ErrMismatch, s.D, s.F, c.Dim, c.FFN)
	case string(c.Activation) != s.Activation:
		return fmt.Errorf("%w: sidecar activation %s, model %s", ErrMismatch, s.Activation, c.Activation)
	}
	if t, ok := m.File.Tensor("blk.0.ffn_gate.weight"); ok && t.DType != s.BundleType {
		return fmt.Errorf("%w: sidecar bundles are %s, the model's FFN is %s", ErrMismatch, s.BundleType, t.DType)
	}
	return nil
}

// Close unmaps the file.
func (s *Sidecar) Close() error { return s.File.Close() }

// Layers is the number of layers.
func (s *Sidecar) Layers() int { return len(s.layers) }

// Bundle is layer l's [F, R] bundle matrix (mapped, not copied).
func (s *Sidecar) Bundle(l int) []byte { return s.File.TensorData(s.layers[l].bundle) }

// BundleOffset is the file offset of layer l's first bundle row (4 KiB-aligned).
func (s *Sidecar) BundleOffset(l int) int64 { return s.File.DataOffset + s.layers[l].bundle.Offset }

// Order is layer l's bundle row → model neuron map.
func (s *Sidecar) Order(l int) []int32 { return s.layers[l].order }

// Freq is layer l's measured activation frequency per bundle row.
func (s *Sidecar) Freq(l int) []float32 { return s.layers[l].freq }

// Predictor returns the trained predictors, decoded to float32 (a new copy on every call: the
// sidecar itself keeps them as stored).
func (s *Sidecar) Predictor() *Trained {
	t := &Trained{D: s.D, F: s.F, Rank: s.PredRank, Threshold: s.PredThreshold}
	for _, ly := range s.layers {
		a, _ := core.Dequantize(core.F16, ly.predA, 0) // sizes checked at open
		b, _ := core.Dequantize(core.F16, ly.predB, 0)
		t.Layers = append(t.Layers, TrainedLayer{A: a, B: b, Bias: ly.bias})
	}
	return t
}

// FromFile reads and validates a parsed sidecar (it takes ownership of f on success).
func FromFile(f *gguf.File) (*Sidecar, error) {
	s := &Sidecar{File: f}
	u := func(key string) (int64, error) {
		v, ok := f.Get(key)
		if !ok {
			return 0, fmt.Errorf("%w: missing %s", ErrFormat, key)
		}
		n, ok := v.Int()
		if !ok || n < 0 {
			return 0, fmt.Errorf("%w: %s = %v is not a count", ErrFormat, key, v.Any())
		}
		return n, nil
	}
	ver, err := u(KeyVersion)
	if err != nil {
		return nil, err
	}
	if ver != Version {
		return nil, fmt.Errorf("sparse: sidecar version %d (this build reads %d): %w", ver, Version, core.ErrIncompatible)
	}
	str := func(key string) (string, error) {
		v, _ := f.Get(key)
		x, ok := v.Str()
		if !ok {
			return "", fmt.Errorf("%w: %s missing or not a string", ErrFormat, key)
		}
		return x, nil
	}
	if s.ModelHash, err = str(KeyModelHash); err != nil {
		return nil, err
	}
	if s.Activation, err = str(KeyActivation); err != nil {
		return nil, err
	}
	if s.Activation != ActReLU && s.Activation != ActReLU2 {
		return nil, fmt.Errorf("%w: activation %q (relu, relu2)", ErrFormat, s.Activation)
	}
	gv, _ := f.Get(KeyGated)
	var ok bool
	if s.Gated, ok = gv.Bool(); !ok {
		return nil, fmt.Errorf("%w: %s missing or not a bool", ErrFormat, KeyGated)
	}
	b, err := u(KeyBudget)
	if err != nil {
		return nil, err
	}
	s.BudgetBytes = uint64(b)
	r, err := u(KeyPredRank)
	if err != nil {
		return nil, err
	}
	ct, err := u(KeyCalibTokens)
	if err != nil {
		return nil, err
	}
	s.CalibTokens = int(ct)
	tv, _ := f.Get(KeyPredThreshold)
	th, ok := tv.Float()
	if !ok || math.IsNaN(th) || math.IsInf(th, 0) {
		return nil, fmt.Errorf("%w: %s missing or not a finite number", ErrFormat, KeyPredThreshold)
	}
	s.PredThreshold = float32(th)
	hv, _ := f.Get(KeyHotCounts)
	hot, ok := hv.Ints()
	if !ok || len(hot) == 0 {
		return nil, fmt.Errorf("%w: %s missing or not an integer array", ErrFormat, KeyHotCounts)
	}
	L := len(hot)
	floats := func(key string) ([]float32, error) {
		v, _ := f.Get(key)
		xs, ok := v.Float32s()
		if !ok || len(xs) != L {
			return nil, fmt.Errorf("%w: %s must hold %d f32 values (one per layer)", ErrFormat, key, L)
		}
		return xs, nil
	}
	if s.Recall, err = floats(KeyPredRecall); err != nil {
		return nil, err
	}
	if s.Precision, err = floats(KeyPredPrecision); err != nil {
		return nil, err
	}
	b0, ok := f.Tensor("blk.0.ffn_bundle")
	if !ok || len(b0.Shape) != 2 {
		return nil, fmt.Errorf("%w: blk.0.ffn_bundle missing or not a matrix", ErrFormat)
	}
	s.BundleType, s.F = b0.DType, int(b0.Shape[0])
	R := int(b0.Shape[1])
	if s.Gated {
		s.D = R / 3
	} else {
		s.D = R / 2
	}
	if s.D == 0 || BundleWidth(s.D, s.Gated) != R || s.F == 0 {
		return nil, fmt.Errorf("%w: bundle row of %d values does not fit the layout (gated %v)", ErrFormat, R, s.Gated)
	}
	switch s.BundleType {
	case core.F32, core.F16, core.Q8_0, core.Q4_0:
	default:
		return nil, fmt.Errorf("%w: bundle dtype %s (F32, F16, Q8_0, Q4_0)", ErrFormat, s.BundleType)
	}
	if r == 0 || r > int64(s.D) {
		return nil, fmt.Errorf("%w: predictor rank %d outside [1, %d]", ErrFormat, r, s.D)
	}
	s.PredRank = int(r)
	s.RowBytes = s.BundleType.Bytes(int64(R))
	s.HotCounts = make([]int, L)
	for l := 0; l < L; l++ {
		if hot[l] < 0 || hot[l] > int64(s.F) {
			return nil, fmt.Errorf("%w: layer %d hot count %d outside [0, %d]", ErrFormat, l, hot[l], s.F)
		}
		s.HotCounts[l] = int(hot[l])
		ly, err := s.readLayer(l, R)
		if err != nil {
			return nil, err
		}
		s.layers = append(s.layers, ly)
	}
	if _, extra := f.Tensor(fmt.Sprintf("blk.%d.ffn_bundle", L)); extra {
		return nil, fmt.Errorf("%w: bundles for more layers than the %d hot counts", ErrFormat, L)
	}
	return s, nil
}

func (s *Sidecar) readLayer(l, R int) (sideLayer, error) {
	var ly sideLayer
	f := s.File
	get := func(name string, dt core.DType, shape ...int64) (*gguf.TensorInfo, []byte, error) {
		full := fmt.Sprintf("blk.%d.%s", l, name)
		t, ok := f.Tensor(full)
		if !ok {
			return nil, nil, fmt.Errorf("%w: tensor %s missing (wrong layer count?)", ErrFormat, full)
		}
		if t.DType != dt || !t.Shape.Equal(core.Shape(shape)) {
			return nil, nil, fmt.Errorf("%w: tensor %s is %s%v, want %s%v", ErrFormat, full, t.DType, t.Shape, dt, shape)
		}
		return t, f.TensorData(t), nil
	}
	F, D, r := int64(s.F), int64(s.D), int64(s.PredRank)
	var err error
	if ly.bundle, _, err = get("ffn_bundle", s.BundleType, F, int64(R)); err != nil {
		return ly, err
	}
	if ly.bundle.Offset%Alignment != 0 {
		return ly, fmt.Errorf("%w: layer %d bundles not %d-byte aligned", ErrFormat, l, Alignment)
	}
	_, ob, err := get("ffn_order", core.I32, F)
	if err != nil {
		return ly, err
	}
	ly.order = make([]int32, F)
	for i := range ly.order {
		ly.order[i] = int32(binary.LittleEndian.Uint32(ob[4*i:]))
	}
	if err := checkPermutation(ly.order, s.F); err != nil {
		return ly, fmt.Errorf("layer %d: %w", l, err)
	}
	dec := func(name string, dt core.DType, shape ...int64) ([]float32, error) {
		_, b, err := get(name, dt, shape...)
		if err != nil {
			return nil, err
		}
		return core.Dequantize(dt, b, 0)
	}
	if ly.freq, err = dec("ffn_freq", core.F32, F); err != nil {
		return ly, err
	}
	if _, ly.predA, err = get("pred_a", core.F16, r, D); err != nil {
		return ly, err
	}
	if _, ly.predB, err = get("pred_b", core.F16, F, r); err != nil {
		return ly, err
	}
	if ly.bias, err = dec("pred_bias", core.F32, F); err != nil {
		return ly, err
	}
	return ly, nil
}
