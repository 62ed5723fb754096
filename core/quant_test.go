package core

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// block32 returns 32 values: the given ones first, then fill.
func block32(fill float32, vals ...float32) []float32 {
	xs := make([]float32, QK)
	for i := range xs {
		xs[i] = fill
	}
	copy(xs, vals)
	return xs
}

func TestQuantizeQ8_0HandComputed(t *testing.T) {
	tests := []struct {
		name string
		xs   []float32
		want []byte // d (f16 LE) then 32 codes; codes past the listed ones equal the fill's
		fill byte
	}{
		{
			// amax 127 -> d = 1, id = 1: codes are roundf(x), half away from zero.
			name: "d=1",
			xs:   block32(0, 0.5, -0.5, 1.4, -2.5, 127, -126.6, 2.5, -1.49),
			want: []byte{0x00, 0x3c, 1, 0xff, 1, 0xfd, 127, 0x81, 3, 0xff},
		},
		{
			// amax 63.5 -> d = 0.5 (f16 0x3800), id = 2.
			name: "d=0.5",
			xs:   block32(1, 63.5, -0.25, 0.2, -63.5),
			want: []byte{0x00, 0x38, 127, 0xff, 0, 0x81},
			fill: 2,
		},
		{
			name: "zeros",
			xs:   block32(0),
			want: []byte{0, 0},
		},
		{
			// amax 1 -> d = 1/127 = 0.007874016 (f32); f16 rounds it to 0x2008 (0.0078125*1.0078125).
			// id = 127.00001: 0.5*id = 63.500004 -> 64.
			name: "d not f16-exact",
			xs:   block32(0, 1, -1, 0.5),
			want: []byte{0x08, 0x20, 127, 0x81, 64},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Quantize(Q8_0, tc.xs, 0)
			require.NoError(t, err)
			require.Len(t, got, 34)
			want := make([]byte, 34)
			for i := len(tc.want); i < 34; i++ {
				want[i] = tc.fill
			}
			copy(want, tc.want)
			assert.Equal(t, want, got)
		})
	}
}

func TestQuantizeQ4_0HandComputed(t *testing.T) {
	tests := []struct {
		name  string
		xs    []float32
		codes [QK]byte // unpacked nibbles
		d     uint16
	}{
		{
			// m = -8 -> d = 1, id = 1: code = min(15, trunc(x + 8.5)).
			name:  "d=1",
			xs:    block32(0, -8, 7, 7.4, 0, -0.5, -0.6, 0.49, 0.5, -7.6),
			codes: [QK]byte{0, 15, 15, 8, 8, 7, 8, 9, 0, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8},
			d:     0x3c00,
		},
		{
			// m = +8 -> d = -1 (f16 0xbc00), id = -1: x = -8 gives 16.5 -> 16, clamped to 15.
			name:  "d=-1 clamps",
			xs:    block32(0, 8, -8, 3),
			codes: [QK]byte{0, 15, 5, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8},
			d:     0xbc00,
		},
		{
			// Equal magnitudes: the first one sets the sign of d. -4 first -> d = 0.5, id = 2.
			name: "first max wins",
			xs: func() []float32 {
				xs := block32(0, -4, 4)
				xs[16], xs[31] = 1.2, -1.3 // high nibbles of bytes 0 and 15
				return xs
			}(),
			codes: func() [QK]byte {
				var c [QK]byte
				for i := range c {
					c[i] = 8
				}
				// -4*2+8.5 = 0.5 -> 0; 4*2+8.5 = 16.5 -> 15; 1.2*2+8.5 = 10.9 -> 10; -1.3*2+8.5 = 5.9 -> 5
				c[0], c[1], c[16], c[31] = 0, 15, 10, 5
				return c
			}(),
			d: 0x3800,
		},
		// 0 / -8 is -0 in f32, as in ggml: d is stored as f16 -0.
		{name: "zeros", xs: block32(0), d: 0x8000, codes: [QK]byte{8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Quantize(Q4_0, tc.xs, 0)
			require.NoError(t, err)
			want := make([]byte, 18)
			binary.LittleEndian.PutUint16(want, tc.d)
			for j := 0; j < 16; j++ {
				want[2+j] = tc.codes[j] | tc.codes[j+16]<<4
			}
			assert.Equal(t, want, got)
		})
	}
}

func TestDequantizeHandComputed(t *testing.T) {
	q8 := make([]byte, 34)
	binary.LittleEndian.PutUint16(q8, 0x3800) // d = 0.5
	q8[2], q8[3], q8[33] = 3, 0xfe, 0x81      // 3, -2, -127
	q8want := make([]float32, 32)
	q8want[0], q8want[1], q8want[31] = 1.5, -1, -63.5

	q4 := make([]byte, 18)
	binary.LittleEndian.PutUint16(q4, 0xc000) // d = -2
	for j := 2; j < 18; j++ {
		q4[j] = 0x88
	}
	q4[2] = 0xf0  // value 0: nibble 0 -> -8*-2 = 16; value 16: nibble 15 -> 7*-2 = -14
	q4[17] = 0x19 // value 15: nibble 9 -> -2; value 31: nibble 1 -> 14
	q4want := make([]float32, 32)
	q4want[0], q4want[16], q4want[15], q4want[31] = 16, -14, -2, 14

	tests := []struct {
		name  string
		dt    DType
		b     []byte
		scale float32
		want  []float32
	}{
		{"f32", F32, []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0}, 0, []float32{1, -2}},
		{"f16", F16, []byte{0x00, 0x3c, 0x00, 0xc1, 0x01, 0x00}, 0, []float32{1, -2.5, 5.960464477539063e-08}},
		{"bf16", BF16, []byte{0x80, 0x3f, 0x49, 0x40}, 0, []float32{1, 3.140625}},
		{"i32", I32, []byte{7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, 0, []float32{7, -1}},
		{"i8", I8, []byte{2, 0xff, 0x81, 0}, 0.25, []float32{0.5, -0.25, -31.75, 0}},
		{"q8_0", Q8_0, q8, 0, q8want},
		{"q4_0", Q4_0, q4, 0, q4want},
		{"empty", Q4_0, nil, 0, []float32{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Dequantize(tc.dt, tc.b, tc.scale)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestQuantizeI8AndHalf(t *testing.T) {
	b, err := Quantize(I8, []float32{0.5, -0.5, 0.24, 100, -100, 0.375, float32(math.NaN())}, 0.25)
	require.NoError(t, err)
	// 2, -2, 0.96 -> 1, clamp 127, clamp -127, 1.5 -> 2 (away from zero), NaN -> 0
	assert.Equal(t, []byte{2, 0xfe, 1, 127, 0x81, 2, 0}, b)

	b, err = Quantize(F16, []float32{1, -2.5, 1.00048828125}, 0)
	require.NoError(t, err)
	assert.Equal(t, []byte{0x00, 0x3c, 0x00, 0xc1, 0x00, 0x3c}, b) // tie rounds to even
	b, err = Quantize(BF16, []float32{1, 3.14159}, 0)
	require.NoError(t, err)
	assert.Equal(t, []byte{0x80, 0x3f, 0x49, 0x40}, b)
}

func TestQuantizeRoundTrip(t *testing.T) {
	xs := make([]float32, 4*QK)
	seed := uint32(12345)
	for i := range xs {
		seed = seed*1664525 + 1013904223
		xs[i] = (float32(seed>>8)/float32(1<<24) - 0.5) * float32(1+i%7)
	}
	for _, dt := range []DType{F32, F16, BF16, Q8_0, Q4_0, I8} {
		t.Run(dt.String(), func(t *testing.T) {
			ys := roundTrip(t, dt, xs, 0.03)
			for blk := 0; blk < len(xs)/QK; blk++ {
				var amax float64
				for _, x := range xs[blk*QK : (blk+1)*QK] {
					amax = math.Max(amax, math.Abs(float64(x)))
				}
				// Bounds: half a step for rounding codes, a whole step for Q4_0's truncation of
				// the clamped end, plus the f16 rounding of d.
				tol := map[DType]float64{F32: 0, F16: amax / 2048, BF16: amax / 256,
					Q8_0: amax/127/2 + amax/2048, Q4_0: amax/8 + amax/2048, I8: 0.015 + 1e-6}[dt]
				for i := blk * QK; i < (blk+1)*QK; i++ {
					assert.InDeltaf(t, xs[i], ys[i], tol, "%s value %d", dt, i)
				}
			}
		})
	}
}

// roundTrip quantizes xs to dt and back (scale as Quantize and Dequantize take it), checking the
// encoded and decoded sizes.
func roundTrip(t *testing.T, dt DType, xs []float32, scale float32) []float32 {
	t.Helper()
	b, err := Quantize(dt, xs, scale)
	require.NoError(t, err)
	require.Len(t, b, int(dt.Bytes(int64(len(xs)))))
	ys, err := Dequantize(dt, b, scale)
	require.NoError(t, err)
	require.Len(t, ys, len(xs))
	return ys
}

func TestQuantizeErrors(t *testing.T) {
	tests := []struct {
		name string
		fn   func() error
	}{
		{"q8_0 not multiple of 32", func() error { _, err := Quantize(Q8_0, make([]float32, 33), 0); return err }},
		{"q4_0 not multiple of 32", func() error { _, err := Quantize(Q4_0, make([]float32, 16), 0); return err }},
		{"i8 zero scale", func() error { _, err := Quantize(I8, make([]float32, 4), 0); return err }},
		{"i8 negative scale", func() error { _, err := Quantize(I8, make([]float32, 4), -1); return err }},
		{"i8 inf scale", func() error { _, err := Quantize(I8, make([]float32, 4), float32(math.Inf(1))); return err }},
		{"quantize to i32", func() error { _, err := Quantize(I32, make([]float32, 4), 0); return err }},
		{"quantize to invalid", func() error { _, err := Quantize(DType(99), make([]float32, 4), 0); return err }},
		{"q8_0 wrong byte count", func() error { _, err := Dequantize(Q8_0, make([]byte, 35), 0); return err }},
		{"q4_0 wrong byte count", func() error { _, err := Dequantize(Q4_0, make([]byte, 17), 0); return err }},
		{"f32 wrong byte count", func() error { _, err := Dequantize(F32, make([]byte, 6), 0); return err }},
		{"f16 odd byte count", func() error { _, err := Dequantize(F16, make([]byte, 3), 0); return err }},
		{"dequantize invalid", func() error { _, err := Dequantize(InvalidDType, make([]byte, 4), 0); return err }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorIs(t, tc.fn(), ErrInvalidArgument)
		})
	}
}

func FuzzDequantize(f *testing.F) {
	f.Add(uint8(Q8_0), make([]byte, 34), float32(1))
	f.Add(uint8(Q4_0), []byte{0xff, 0x7f, 1, 2, 3}, float32(0))
	f.Add(uint8(I8), []byte{0x80, 0x7f}, float32(math.NaN()))
	f.Fuzz(func(t *testing.T, dt uint8, b []byte, scale float32) {
		d := DType(dt)
		xs, err := Dequantize(d, b, scale)
		if err != nil {
			return
		}
		if int64(len(b)) != d.Bytes(int64(len(xs))) {
			t.Fatalf("%s: %d bytes gave %d values", d, len(b), len(xs))
		}
		if d == I32 {
			return // not a quantize target
		}
		// Whatever the bytes, re-quantizing the values must work and keep the size.
		q, err := Quantize(d, xs, scale)
		if err != nil {
			if d == I8 { // a scale Quantize refuses
				return
			}
			t.Fatalf("%s: re-quantize: %v", d, err)
		}
		if len(q) != len(b) {
			t.Fatalf("%s: re-quantized to %d bytes, want %d", d, len(q), len(b))
		}
	})
}

func FuzzQuantize(f *testing.F) {
	f.Add(uint8(Q8_0), make([]byte, 128), float32(1))
	f.Add(uint8(Q4_0), make([]byte, 4*QK), float32(0))
	f.Fuzz(func(t *testing.T, dt uint8, raw []byte, scale float32) {
		xs := DecodeF32(raw)
		d := DType(dt)
		b, err := Quantize(d, xs, scale)
		if err != nil {
			return
		}
		ys, err := Dequantize(d, b, scale)
		if err != nil {
			t.Fatalf("%s: dequantize of own output: %v", d, err)
		}
		if len(ys) != len(xs) {
			t.Fatalf("%s: %d values came back as %d", d, len(xs), len(ys))
		}
	})
}
