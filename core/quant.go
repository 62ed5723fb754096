package core

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Quantize encodes xs in dt's storage layout: F32, F16, BF16 (round to nearest even), Q8_0 and
// Q4_0 (bit-exact with ggml's quantize_row_q8_0_ref / quantize_row_q4_0_ref; len(xs) must be a
// multiple of 32), the K-quants Q4_K, Q5_K, Q6_K, Q2_K, Q3_K (bit-exact with ggml's
// quantize_row_qN_K_ref, i.e. llama-quantize without an importance matrix; len(xs) a multiple of
// 256), or I8 (per-tensor symmetric, value = scale*q, scale > 0). scale is used for I8
// only. Non-finite inputs, and Q8_0/Q4_0 blocks so small that 1/d overflows, give deterministic
// but unspecified codes (ggml's C is undefined there; abi/OPS.md).
func Quantize(dt DType, xs []float32, scale float32) ([]byte, error) {
	switch dt {
	case F32:
		return EncodeF32(xs), nil
	case F16, BF16:
		conv := F32ToF16
		if dt == BF16 {
			conv = F32ToBF16
		}
		b := make([]byte, 2*len(xs))
		for i, x := range xs {
			binary.LittleEndian.PutUint16(b[2*i:], conv(x))
		}
		return b, nil
	case Q8_0, Q4_0:
		if len(xs)%QK != 0 {
			return nil, fmt.Errorf("quantize %s: %d values is not a multiple of %d: %w", dt, len(xs), QK, ErrInvalidArgument)
		}
		b := make([]byte, dt.Bytes(int64(len(xs))))
		bs := int(dt.BlockBytes())
		for i := 0; i < len(xs)/QK; i++ {
			blk, out := xs[i*QK:(i+1)*QK], b[i*bs:(i+1)*bs]
			if dt == Q8_0 {
				quantizeQ8_0(blk, out)
			} else {
				quantizeQ4_0(blk, out)
			}
		}
		return b, nil
	case Q4_K, Q5_K, Q6_K, Q2_K, Q3_K:
		if len(xs)%QKK != 0 {
			return nil, fmt.Errorf("quantize %s: %d values is not a multiple of %d: %w", dt, len(xs), QKK, ErrInvalidArgument)
		}
		b := make([]byte, dt.Bytes(int64(len(xs))))
		bs := int(dt.BlockBytes())
		for i := 0; i < len(xs)/QKK; i++ {
			quantKBlock(dt, xs[i*QKK:(i+1)*QKK], b[i*bs:(i+1)*bs])
		}
		return b, nil
	case I8:
		if !(scale > 0) || math.IsInf(float64(scale), 0) {
			return nil, fmt.Errorf("quantize i8: scale %g must be positive and finite: %w", scale, ErrInvalidArgument)
		}
		b := make([]byte, len(xs))
		for i, x := range xs {
			b[i] = byte(int8(roundClamp(x/scale, -127, 127)))
		}
		return b, nil
	}
	return nil, fmt.Errorf("quantize to %s is not defined: %w", dt, ErrInvalidArgument)
}

// quantizeQ8_0 follows ggml's quantize_row_q8_0_ref: the codes use the f32 d, the block stores
// d rounded to f16.
func quantizeQ8_0(xs []float32, out []byte) {
	var amax float32
	for _, x := range xs {
		amax = max(amax, float32(math.Abs(float64(x))))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(out, F32ToF16(d))
	for j, x := range xs {
		out[2+j] = byte(int8(roundClamp(x*id, -127, 127)))
	}
}

// quantizeQ4_0 follows ggml's quantize_row_q4_0_ref: d comes from the signed value of largest
// magnitude (first one wins on ties), codes are truncated, not rounded.
func quantizeQ4_0(xs []float32, out []byte) {
	var amax, m float32
	for _, x := range xs {
		if a := float32(math.Abs(float64(x))); amax < a {
			amax, m = a, x
		}
	}
	d := m / -8
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(out, F32ToF16(d))
	for j := 0; j < QK/2; j++ {
		lo := q4Code(xs[j], id)
		hi := q4Code(xs[j+QK/2], id)
		out[2+j] = lo | hi<<4
	}
}

// q4Code is ggml's MIN(15, (int8_t)(x*id + 8.5f)). The explicit float32 conversion stops the
// compiler from fusing the multiply and add (an FMA would change the rounding).
func q4Code(x, id float32) byte {
	v := float32(x*id) + 8.5
	switch {
	case v != v || v < 0:
		return 8 // NaN or out of range (undefined in C): the code for zero
	case v >= 15:
		return 15
	}
	return byte(int8(v)) // truncation toward zero, like the C cast
}

// roundClamp rounds half away from zero (C roundf) and clamps to [lo, hi]; NaN gives 0.
func roundClamp(v float32, lo, hi float64) int {
	if v != v {
		return 0
	}
	r := math.Round(float64(v))
	return int(min(max(r, lo), hi))
}

// Dequantize decodes b, laid out as dt, to float32 values: F32, F16, BF16, I32 (converted to
// float), I8 (scale*q), Q8_0, Q4_0 and the K-quants (bit-exact with ggml's dequantize_row_*).
// len(b) must be a whole number of dt's blocks.
func Dequantize(dt DType, b []byte, scale float32) ([]float32, error) {
	if !dt.Valid() {
		return nil, fmt.Errorf("dequantize: dtype %s: %w", dt, ErrInvalidArgument)
	}
	bs := int(dt.BlockBytes())
	if len(b)%bs != 0 {
		return nil, fmt.Errorf("dequantize %s: %d bytes is not a multiple of the %d-byte block: %w",
			dt, len(b), bs, ErrInvalidArgument)
	}
	nb := len(b) / bs
	xs := make([]float32, nb*int(dt.BlockLen()))
	switch dt {
	case F32:
		return DecodeF32(b), nil
	case F16:
		for i := range xs {
			xs[i] = F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case BF16:
		for i := range xs {
			xs[i] = BF16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case I32:
		for i := range xs {
			xs[i] = float32(int32(binary.LittleEndian.Uint32(b[4*i:])))
		}
	case I8:
		for i := range xs {
			xs[i] = scale * float32(int8(b[i]))
		}
	case Q8_0:
		for i := 0; i < nb; i++ {
			blk := b[i*bs:]
			d := F16ToF32(binary.LittleEndian.Uint16(blk))
			for j := 0; j < QK; j++ {
				xs[i*QK+j] = d * float32(int8(blk[2+j]))
			}
		}
	case Q4_K, Q5_K, Q6_K, Q2_K, Q3_K:
		for i := 0; i < nb; i++ {
			dequantKBlock(dt, b[i*bs:(i+1)*bs], xs[i*QKK:(i+1)*QKK])
		}
	case Q4_0:
		for i := 0; i < nb; i++ {
			blk := b[i*bs:]
			d := F16ToF32(binary.LittleEndian.Uint16(blk))
			for j := 0; j < QK/2; j++ {
				q := blk[2+j]
				xs[i*QK+j] = d * float32(int(q&0x0f)-8)
				xs[i*QK+j+QK/2] = d * float32(int(q>>4)-8)
			}
		}
	}
	return xs, nil
}
