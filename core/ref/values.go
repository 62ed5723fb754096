package ref

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
)

// value is a tensor's bytes in its storage layout, with its type.
type value struct {
	dt    core.DType
	shape core.Shape
	b     []byte
}

func (v value) n() int { return int(v.shape.NumElements()) }

// floats decodes v to float64 (exact: every dtype's values are representable). scale is the I8
// scale; other dtypes ignore it.
func (v value) floats(scale float32) ([]float64, error) {
	xs, err := core.Dequantize(v.dt, v.b, scale)
	if err != nil {
		return nil, err
	}
	return widen(xs), nil
}

// floats2 decodes the first two inputs of a node whose float operands have no scale.
func floats2(in []value) (a, b []float64, err error) {
	if a, err = in[0].floats(0); err != nil {
		return nil, nil, err
	}
	if b, err = in[1].floats(0); err != nil {
		return nil, nil, err
	}
	return a, b, nil
}

func widen(xs []float32) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

// ints decodes an I32 value.
func (v value) ints() []int32 { return core.DecodeI32(v.b) }

// encode rounds xs once to dt (F32, F16 or BF16, round to nearest even).
func encode(dt core.DType, xs []float64) ([]byte, error) {
	switch dt {
	case core.F32:
		b := make([]byte, 4*len(xs))
		for i, x := range xs {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(x)))
		}
		return b, nil
	case core.F16, core.BF16:
		conv := core.F32ToF16
		if dt == core.BF16 {
			conv = core.F32ToBF16
		}
		b := make([]byte, 2*len(xs))
		for i, x := range xs {
			binary.LittleEndian.PutUint16(b[2*i:], conv(toOddF32(x)))
		}
		return b, nil
	}
	return nil, fmt.Errorf("ref: cannot encode float results as %s: %w", dt, core.ErrInternal)
}

// toOddF32 rounds x to float32 with round-to-odd. Rounding that result to a format with at least
// two fewer significand bits (f16, bf16) then equals rounding x directly: a float64 result is
// rounded once, as OPS.md requires, not twice through float32.
func toOddF32(x float64) float32 {
	f := float32(x)
	if float64(f) == x || x != x {
		return f
	}
	if math.Float32bits(f)&1 == 1 {
		return f
	}
	// f is the even neighbour; the odd one lies on x's side of f.
	if float64(f) < x {
		return math.Nextafter32(f, float32(math.Inf(1)))
	}
	return math.Nextafter32(f, float32(math.Inf(-1)))
}

// strides returns row-major element strides of s.
func strides(s core.Shape) []int {
	st := make([]int, len(s))
	acc := 1
	for i := len(s) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= int(s[i])
	}
	return st
}

// broadcastStrides gives, for each axis of out, the stride of in along it (0 where in is
// broadcast or absent): numpy's right-aligned rules.
func broadcastStrides(in, out core.Shape) []int {
	st := strides(in)
	bs := make([]int, len(out))
	off := len(out) - len(in)
	for i := range out {
		if j := i - off; j >= 0 && in[j] != 1 {
			bs[i] = st[j]
		}
	}
	return bs
}

// unravel writes the multi-index of flat index i in shape s into idx.
func unravel(i int, s core.Shape, idx []int) {
	for d := len(s) - 1; d >= 0; d-- {
		n := int(s[d])
		idx[d] = i % n
		i /= n
	}
}

func dot(idx, st []int) int {
	o := 0
	for d := range idx {
		o += idx[d] * st[d]
	}
	return o
}
