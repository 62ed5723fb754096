package core

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestF16RoundTrip(t *testing.T) {
	tests := []struct {
		in   float32
		want uint16
	}{
		{0, 0x0000}, {1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {65520, 0x7c00},
		{float32(math.Inf(-1)), 0xfc00}, {5.960464477539063e-08, 0x0001}, {6.103515625e-05, 0x0400},
		{1.0009765625, 0x3c01}, {1.00048828125, 0x3c00}, {1.00146484375, 0x3c02}, // ties to even
	}
	for _, tc := range tests {
		assert.Equalf(t, tc.want, F32ToF16(tc.in), "F32ToF16(%g)", tc.in)
	}
	for h := 0; h < 0x10000; h++ {
		f := F16ToF32(uint16(h))
		if f != f {
			assert.True(t, math.IsNaN(float64(F16ToF32(F32ToF16(f)))))
			continue
		}
		assert.Equal(t, uint16(h), F32ToF16(f), "half 0x%04x", h)
	}
}

func TestBF16(t *testing.T) {
	assert.Equal(t, uint16(0x3f80), F32ToBF16(1))
	assert.Equal(t, float32(1), BF16ToF32(0x3f80))
	assert.Equal(t, uint16(0x3f80), F32ToBF16(math.Float32frombits(0x3f808000))) // tie to even
	assert.Equal(t, uint16(0x3f82), F32ToBF16(math.Float32frombits(0x3f818000)))
	assert.True(t, math.IsNaN(float64(BF16ToF32(F32ToBF16(float32(math.NaN()))))))
}

func TestEncodeDecode(t *testing.T) {
	xs := []float32{1, -2.5, 3e-8}
	assert.Equal(t, xs, DecodeF32(EncodeF32(xs)))
	is := []int32{0, -1, 1 << 30}
	assert.Equal(t, is, DecodeI32(EncodeI32(is)))
}
