package core

import (
	"encoding/binary"
	"math"
)

// EncodeF32 returns the little-endian bytes of xs (the layout of an F32 tensor).
func EncodeF32(xs []float32) []byte {
	b := make([]byte, 4*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// DecodeF32 reads an F32 tensor's bytes (len(b)/4 values).
func DecodeF32(b []byte) []float32 { return DecodeF32To(nil, b) }

// DecodeF32To is DecodeF32 into dst's storage when it has the room (a loop that decodes every
// step allocates nothing).
func DecodeF32To(dst []float32, b []byte) []float32 {
	n := len(b) / 4
	if cap(dst) < n {
		dst = make([]float32, n)
	}
	dst = dst[:n]
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return dst
}

// EncodeI32 returns the little-endian bytes of xs (an I32 tensor).
func EncodeI32(xs []int32) []byte {
	b := make([]byte, 4*len(xs))
	PutI32(b, xs)
	return b
}

// PutI32 writes xs as little-endian I32 values at the start of b (4·len(xs) bytes).
func PutI32(b []byte, xs []int32) {
	b = b[:4*len(xs)]
	for i, x := range xs {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
}

// DecodeI32 reads an I32 tensor's bytes.
func DecodeI32(b []byte) []int32 {
	xs := make([]int32, len(b)/4)
	for i := range xs {
		xs[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return xs
}

// F32ToF16 converts to IEEE binary16, rounding to nearest even; NaN stays NaN, overflow gives Inf.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	switch {
	case exp == 0xff: // Inf or NaN
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp-127 > 15: // overflow
		return sign | 0x7c00
	case exp-127 >= -14: // normal half
		e := uint32(exp-127+15) << 10
		m := man >> 13
		rest := man & 0x1fff
		h := e | m
		if rest > 0x1000 || (rest == 0x1000 && m&1 == 1) {
			h++ // may carry into the exponent, which is correct (up to Inf)
		}
		return sign | uint16(h)
	case exp-127 >= -25: // subnormal half
		man |= 0x800000
		shift := uint32(-14 - (exp - 127) + 13)
		m := man >> shift
		rest := man & ((1 << shift) - 1)
		half := uint32(1) << (shift - 1)
		if rest > half || (rest == half && m&1 == 1) {
			m++
		}
		return sign | uint16(m)
	}
	return sign // underflow to zero
}

// F16ToF32 converts IEEE binary16 to float32 exactly.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	// subnormal: normalize
	e := uint32(113)
	for man&0x400 == 0 {
		man <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (man&0x3ff)<<13)
}

// F32ToBF16 converts to bfloat16, rounding to nearest even; NaN stays NaN.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// BF16ToF32 converts bfloat16 to float32 exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }
