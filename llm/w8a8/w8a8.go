// Package w8a8 prepares a Llama-family model for an NPU that multiplies per-tensor int8
// activations by int8 weights (mllm-NPU's W8A8 with shadow outlier execution): the weight
// conversion and its GGUF layout, the model key a calibration is bound to, and the
// calibration record with its rules, the calibration run (Calibrate) and the lowering of a
// runner's projections (NewLowering, WithLowering: a projection hook of package llm).
//
// # GGUF layout (xpu quantize --npu-int8)
//
// The file keeps every original tensor, so CPU and GPU units run the model as before, and adds,
// for each of the seven projection matrices of every layer (attn_q, attn_k, attn_v,
// attn_output, ffn_gate, ffn_up, ffn_down; not the embedding, not the output head):
//
//	<name>.npu_i8     ggml type I8 (24), the matrix's shape [N, K]: symmetric int8 codes
//	                  q = clamp(round_half_away(w / s), -127, 127)
//	<name>.npu_scale  F32 [1] (per tensor) or [N] (per output channel, row n of the matrix):
//	                  s = max|w| / 127 over the tensor or the row (1 for an all-zero one)
//
// and the metadata keys
//
//	xpu.npu_int8.version      uint32 1
//	xpu.npu_int8.granularity  string "tensor" or "channel"
//
// The weights are quantized from the original's values (F32, F16, BF16, Q8_0, Q4_0, K-quants
// all dequantize first), so a Q4_0 model's int8 weights carry its 4-bit rounding as well.
// Without these tensors, a runner converts the same way at load time (per tensor by default).
package w8a8

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
)

// Metadata keys and tensor suffixes of the GGUF layout (see the package doc).
const (
	KeyVersion     = "xpu.npu_int8.version"
	KeyGranularity = "xpu.npu_int8.granularity"
	SuffixCodes    = ".npu_i8"
	SuffixScale    = ".npu_scale"
	// LayoutVersion is the layout this package writes and reads.
	LayoutVersion = 1
)

// Projections are the matrices of a layer that run as W8A8, in graph order, and Inputs the
// activation each reads (projections sharing an input share its calibration).
var Projections = []string{"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}

// Input names, one per distinct MATMUL input of a layer.
const (
	InputAttn    = "attn_in"     // attn_norm(x): Q, K, V
	InputAttnOut = "attn_out_in" // the attention's output: attn_output
	InputFFN     = "ffn_in"      // ffn_norm(x): gate, up
	InputDown    = "ffn_down_in" // silu(gate)·up: ffn_down
)

// Inputs are the four MATMUL inputs of a layer in graph order.
var Inputs = []string{InputAttn, InputAttnOut, InputFFN, InputDown}

// InputOf is the input a projection reads.
func InputOf(proj string) string {
	switch proj {
	case "attn_q", "attn_k", "attn_v":
		return InputAttn
	case "attn_output":
		return InputAttnOut
	case "ffn_gate", "ffn_up":
		return InputFFN
	}
	return InputDown
}

// Errors.
var (
	// ErrNoInt8: the model holds no NPU int8 weights (and the caller did not allow converting
	// at load time).
	ErrNoInt8 = errors.New("w8a8: the model has no NPU int8 weights (xpu quantize --npu-int8)")
	// ErrStale: a calibration was made for another model (or another version of this one).
	ErrStale = errors.New("w8a8: the calibration belongs to another model")
	// ErrBadCalibration: a calibration record is malformed or does not fit the model's shape.
	ErrBadCalibration = errors.New("w8a8: bad calibration")
)

// Granularity of the weight scales.
type Granularity int

const (
	// PerTensor: one scale per matrix (what every NPU's int8 MatMul takes).
	PerTensor Granularity = iota
	// PerChannel: one scale per output channel (a row of the [N, K] weight).
	PerChannel
)

func (g Granularity) String() string {
	if g == PerChannel {
		return "channel"
	}
	return "tensor"
}

// ParseGranularity reads "tensor" or "channel".
func ParseGranularity(s string) (Granularity, error) {
	switch s {
	case "tensor":
		return PerTensor, nil
	case "channel":
		return PerChannel, nil
	}
	return 0, fmt.Errorf("w8a8: granularity %q (tensor or channel): %w", s, core.ErrInvalidArgument)
}

// Weight is one matrix's int8 form.
type Weight struct {
	// Codes are the int8 codes, row-major [N, K] (as bytes).
	Codes []byte
	// Scales: one per tensor (len 1) or one per row (len N).
	Scales []float32
}

// QuantizeWeight quantizes a float matrix [n, k] symmetrically: one scale for the tensor, or
// one per row with PerChannel; the scale is max|w|/127 (1 where every value is 0).
func QuantizeWeight(xs []float32, n, k int, g Granularity) (Weight, error) {
	if n < 0 || k < 0 || len(xs) != n*k {
		return Weight{}, fmt.Errorf("w8a8: %d values for a [%d, %d] matrix: %w", len(xs), n, k, core.ErrInvalidArgument)
	}
	scaleOf := func(v []float32) (float32, error) {
		var amax float32
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return 0, fmt.Errorf("w8a8: weight value %g is not finite: %w", x, core.ErrInvalidArgument)
			}
			amax = max(amax, float32(math.Abs(float64(x))))
		}
		if amax == 0 {
			return 1, nil
		}
		return amax / 127, nil
	}
	w := Weight{Codes: make([]byte, len(xs))}
	if g == PerTensor {
		s, err := scaleOf(xs)
		if err != nil {
			return Weight{}, err
		}
		b, err := core.Quantize(core.I8, xs, s)
		if err != nil {
			return Weight{}, err
		}
		w.Codes, w.Scales = b, []float32{s}
		return w, nil
	}
	w.Scales = make([]float32, n)
	for r := range n {
		row := xs[r*k : (r+1)*k]
		s, err := scaleOf(row)
		if err != nil {
			return Weight{}, err
		}
		b, err := core.Quantize(core.I8, row, s)
		if err != nil {
			return Weight{}, err
		}
		copy(w.Codes[r*k:], b)
		w.Scales[r] = s
	}
	return w, nil
}

// Dequantize returns the float values w stands for ([n, k]).
func (w Weight) Dequantize(n, k int) []float32 {
	out := make([]float32, n*k)
	for i, c := range w.Codes {
		s := w.Scales[0]
		if len(w.Scales) > 1 {
			s = w.Scales[i/k]
		}
		out[i] = float32(int8(c)) * s
	}
	return out
}

// MatrixNames are the names of the matrices converted for a model of the given layer count.
func MatrixNames(layers int) []string {
	var ns []string
	for l := range layers {
		for _, p := range Projections {
			ns = append(ns, fmt.Sprintf("blk.%d.%s.weight", l, p))
		}
	}
	return ns
}

// FromFile reads matrix name's int8 form from f's layout tensors; ok is false when f has none
// for it. A malformed layout (wrong dtype or shape, a scale that is not positive) is an error.
func FromFile(f *gguf.File, name string) (w Weight, g Granularity, ok bool, err error) {
	ct, hasC := f.Tensor(name + SuffixCodes)
	st, hasS := f.Tensor(name + SuffixScale)
	if !hasC && !hasS {
		return Weight{}, 0, false, nil
	}
	orig, hasO := f.Tensor(name)
	bad := func(format string, args ...any) error {
		return fmt.Errorf("w8a8: %s: %s: %w", name, fmt.Sprintf(format, args...), core.ErrInvalidArgument)
	}
	switch {
	case !hasC || !hasS:
		return Weight{}, 0, false, bad("the layout needs both %s and %s", SuffixCodes, SuffixScale)
	case ct.DType != core.I8 || len(ct.Shape) != 2:
		return Weight{}, 0, false, bad("codes are %s %s, want I8 [N, K]", ct.DType, ct.Shape)
	case hasO && !orig.Shape.Equal(ct.Shape):
		return Weight{}, 0, false, bad("codes are %s, the matrix %s", ct.Shape, orig.Shape)
	case st.DType != core.F32 || len(st.Shape) != 1 || (st.Shape[0] != 1 && st.Shape[0] != ct.Shape[0]):
		return Weight{}, 0, false, bad("scales are %s %s, want F32 [1] or [%d]", st.DType, st.Shape, ct.Shape[0])
	}
	scales := core.DecodeF32(f.TensorData(st))
	for i, s := range scales {
		if !(s > 0) || math.IsInf(float64(s), 0) {
			return Weight{}, 0, false, bad("scale %d is %g, want positive and finite", i, s)
		}
	}
	g = PerTensor
	if st.Shape[0] != 1 || ct.Shape[0] == 1 && layoutGranularity(f) == PerChannel {
		g = PerChannel
	}
	return Weight{Codes: f.TensorData(ct), Scales: scales}, g, true, nil
}

// layoutGranularity is the file's declared granularity (per tensor when absent).
func layoutGranularity(f *gguf.File) Granularity {
	if v, ok := f.Get(KeyGranularity); ok {
		if s, ok := v.Str(); ok && s == "channel" {
			return PerChannel
		}
	}
	return PerTensor
}

// HasLayout reports whether f declares the NPU int8 layout, and checks its version.
func HasLayout(f *gguf.File) (bool, error) {
	v, ok := f.Get(KeyVersion)
	if !ok {
		return false, nil
	}
	n, isInt := v.Int()
	if !isInt || n != LayoutVersion {
		return false, fmt.Errorf("w8a8: %s = %v, this build reads version %d: %w", KeyVersion, v.Any(), LayoutVersion, core.ErrUnsupported)
	}
	return true, nil
}

// ModelKey identifies the model a calibration belongs to: a SHA-256 (hex, first 32 digits) of
// the name, dtype, shape and data of every tensor except the NPU int8 layout's, so a model and
// its `quantize --npu-int8` copy share a key, and any change to a weight changes it.
func ModelKey(f *gguf.File) string {
	h := sha256.New()
	var buf [8]byte
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if strings.HasSuffix(t.Name, SuffixCodes) || strings.HasSuffix(t.Name, SuffixScale) {
			continue
		}
		io.WriteString(h, t.Name)
		io.WriteString(h, "\x00"+t.DType.String()+"\x00")
		for _, d := range t.Shape {
			binary.LittleEndian.PutUint64(buf[:], uint64(d))
			h.Write(buf[:])
		}
		h.Write(f.TensorData(t))
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// WriteTensors are the layout tensors for the matrices of f named by names, generated one at a
// time when written (gguf.Write), each from the original's values.
func WriteTensors(f *gguf.File, names []string, g Granularity) ([]gguf.WriteTensor, error) {
	var ts []gguf.WriteTensor
	for _, name := range names {
		t, ok := f.Tensor(name)
		if !ok {
			return nil, fmt.Errorf("w8a8: tensor %s: %w", name, core.ErrNotFound)
		}
		if len(t.Shape) != 2 {
			return nil, fmt.Errorf("w8a8: tensor %s is %s, want a matrix: %w", name, t.Shape, core.ErrInvalidArgument)
		}
		if _, _, has, err := FromFile(f, name); err != nil || has {
			if err == nil {
				err = fmt.Errorf("w8a8: %s already has NPU int8 weights: %w", name, core.ErrInvalidArgument)
			}
			return nil, err
		}
		n, k := int(t.Shape[0]), int(t.Shape[1])
		var w *Weight
		get := func() (*Weight, error) {
			if w != nil {
				return w, nil
			}
			xs, err := core.Dequantize(t.DType, f.TensorData(t), 0)
			if err != nil {
				return nil, fmt.Errorf("w8a8: %s: %w", name, err)
			}
			q, err := QuantizeWeight(xs, n, k, g)
			if err != nil {
				return nil, fmt.Errorf("w8a8: %s: %w", name, err)
			}
			w = &q
			return w, nil
		}
		scaleLen := int64(1)
		if g == PerChannel {
			scaleLen = int64(n)
		}
		ts = append(ts,
			gguf.WriteTensor{Name: name + SuffixCodes, DType: core.I8, Shape: t.Shape, Gen: func() ([]byte, error) {
				q, err := get()
				if err != nil {
					return nil, err
				}
				return q.Codes, nil
			}},
			gguf.WriteTensor{Name: name + SuffixScale, DType: core.F32, Shape: core.Shape{scaleLen}, Gen: func() ([]byte, error) {
				q, err := get()
				if err != nil {
					return nil, err
				}
				w = nil // written after its codes: the matrix need not stay in memory
				return core.EncodeF32(q.Scales), nil
			}})
	}
	return ts, nil
}

// LayoutKVs returns kvs with the layout's keys set (replaced where present).
func LayoutKVs(kvs []gguf.KeyValue, g Granularity) []gguf.KeyValue {
	out := slices.DeleteFunc(slices.Clone(kvs), func(kv gguf.KeyValue) bool {
		return kv.Key == KeyVersion || kv.Key == KeyGranularity
	})
	return append(out,
		gguf.KeyValue{Key: KeyVersion, Value: gguf.MustValue(uint32(LayoutVersion))},
		gguf.KeyValue{Key: KeyGranularity, Value: gguf.MustValue(g.String())})
}

// ProjectionNames are the projection matrices f holds (blk.N.<projection>.weight), in file
// order: the matrices the layout converts.
func ProjectionNames(f *gguf.File) []string {
	var ns []string
	for i := range f.Tensors {
		name := f.Tensors[i].Name
		rest, ok := strings.CutPrefix(name, "blk.")
		if !ok {
			continue
		}
		dot := strings.IndexByte(rest, '.')
		if dot <= 0 || strings.Trim(rest[:dot], "0123456789") != "" {
			continue
		}
		if p, ok := strings.CutSuffix(rest[dot+1:], ".weight"); ok && slices.Contains(Projections, p) {
			ns = append(ns, name)
		}
	}
	return ns
}

// Summary counts what WriteModel wrote.
type Summary struct {
	// Matrices is the number of matrices given int8 weights; Bytes the bytes added.
	Matrices int
	Bytes    int64
}

// WriteModel writes f to w with every original tensor and metadata key kept and the NPU int8
// layout added for its projection matrices (g: per tensor or per output channel). ctx stops
// a long run between tensors. A file that already has the layout is an error.
func WriteModel(ctx context.Context, w io.Writer, f *gguf.File, g Granularity) (Summary, error) {
	if has, err := HasLayout(f); err != nil || has {
		if err == nil {
			err = fmt.Errorf("w8a8: the file already has NPU int8 weights: %w", core.ErrInvalidArgument)
		}
		return Summary{}, err
	}
	names := ProjectionNames(f)
	if len(names) == 0 {
		return Summary{}, fmt.Errorf("w8a8: no projection matrices (blk.N.attn_q.weight, ...) in the file: %w", core.ErrNotFound)
	}
	extra, err := WriteTensors(f, names, g)
	if err != nil {
		return Summary{}, err
	}
	var ts []gguf.WriteTensor
	for i := range f.Tensors {
		t := &f.Tensors[i]
		ts = append(ts, gguf.WriteTensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Data: f.TensorData(t)})
	}
	sum := Summary{Matrices: len(names)}
	for _, t := range extra {
		gen := t.Gen
		t.Gen = func() ([]byte, error) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return gen()
		}
		sum.Bytes += t.DType.Bytes(t.Shape.NumElements())
		ts = append(ts, t)
	}
	if err := gguf.Write(w, LayoutKVs(f.KV, g), ts); err != nil {
		return Summary{}, fmt.Errorf("w8a8: %w", err)
	}
	return sum, nil
}
