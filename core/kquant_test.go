package core

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var kquants = []DType{Q4_K, Q5_K, Q6_K, Q2_K, Q3_K}

// kGolden is what testdata/kquant_gen.c wrote with llama.cpp's libggml-base: ggml's
// quantize_row_qN_K_ref of the shared inputs, and dequantize_row_qN_K of random blocks.
type kGolden struct {
	inputs    []float32
	quantized []byte
	random    []byte
	decoded   []float32
}

func loadKGolden(t *testing.T, dt DType) kGolden {
	t.Helper()
	in, err := os.ReadFile(filepath.Join("testdata", "kquant_inputs.bin"))
	require.NoError(t, err)
	nb := int(binary.LittleEndian.Uint32(in))
	require.Len(t, in, 4+nb*QKK*4)
	g := kGolden{inputs: DecodeF32(in[4:])}
	b, err := os.ReadFile(filepath.Join("testdata", "kquant_"+dt.String()+".bin"))
	require.NoError(t, err)
	bs := int(dt.BlockBytes())
	g.quantized, b = b[:nb*bs], b[nb*bs:]
	nr := int(binary.LittleEndian.Uint32(b))
	require.Len(t, b, 4+nr*bs+nr*QKK*4)
	g.random = b[4 : 4+nr*bs]
	g.decoded = DecodeF32(b[4+nr*bs:])
	return g
}

func TestKQuantMatchesGGML(t *testing.T) {
	for _, dt := range kquants {
		t.Run(dt.String(), func(t *testing.T) {
			g := loadKGolden(t, dt)
			bs := int(dt.BlockBytes())
			got, err := Quantize(dt, g.inputs, 0)
			require.NoError(t, err)
			require.Len(t, got, len(g.quantized))
			for i := 0; i < len(got)/bs; i++ {
				assert.Equal(t, g.quantized[i*bs:(i+1)*bs], got[i*bs:(i+1)*bs], "super-block %d", i)
			}
			dec, err := Dequantize(dt, g.random, 0)
			require.NoError(t, err)
			require.Len(t, dec, len(g.decoded))
			for i := range dec {
				if math.Float32bits(dec[i]) != math.Float32bits(g.decoded[i]) {
					t.Fatalf("value %d: got %g, ggml %g", i, dec[i], g.decoded[i])
				}
			}
		})
	}
}

// TestKQuantHandDecoded checks the OPS.md layouts on blocks built by hand, independently of
// the golden files: one non-zero field at a time, so a swapped offset or shift shows.
func TestKQuantHandDecoded(t *testing.T) {
	f16 := func(b []byte, off int, v float32) { binary.LittleEndian.PutUint16(b[off:], F32ToF16(v)) }
	tests := []struct {
		name  string
		dt    DType
		build func(b []byte)
		want  map[int]float32 // values not listed: rest of the sub-block, else 0
		sub   int             // the sub-block (of subLen values) that holds the listed values
		rest  float32
	}{
		{"q4_k sub-block 5 high nibble", Q4_K, func(b []byte) {
			f16(b, 0, 0.5)
			f16(b, 2, 0.25)
			b[4+5+4] = 0x32 // s=5: sc low nibble 2, m low nibble 3
			b[4+1] = 1 << 6 // sc high bits of s=5 → sc = 2 | 1<<4 = 18
			b[16+32*2+7] = 0x90
		}, map[int]float32{32*5 + 7: 0.5*18*9 - 0.25*3}, 5, -0.25 * 3},
		{"q5_k high bit", Q5_K, func(b []byte) {
			f16(b, 0, 1)
			b[4+2] = 1        // s=2: sc = 1, m = 0
			b[16+3] = 1 << 2  // qh[3] bit 2 → value 64+3 gets +16
			b[48+32+3] = 0x0F // chunk 1, low nibble
		}, map[int]float32{64 + 3: 31}, 2, 0},
		{"q6_k", Q6_K, func(b []byte) {
			f16(b, 208, 2)
			for i := 192; i < 208; i++ {
				b[i] = 1
			}
			b[192+(128+96+5)/16] = 0xFF // -1
			for i := 0; i < 128; i++ {
				b[i] = 0x00
			}
			for i := 128; i < 192; i++ {
				b[i] = 0xAA // all high pairs 2 → q = 32: value 0
			}
			b[64+32+5] = 0x70 // h=1, j=3: high nibble 7 → q = 7|2<<4 = 39
		}, map[int]float32{128 + 96 + 5: 2 * -1 * 7}, 14, 0},
		{"q2_k", Q2_K, func(b []byte) {
			f16(b, 80, 0.5)
			f16(b, 82, 1)
			b[(128+64+20)/16] = 0x23 // sc 3, m 2
			b[16+32+20] = 3 << 4     // h=1, j=2
		}, map[int]float32{128 + 64 + 20: 0.5*3*3 - 2}, 13, -2},
		{"q3_k", Q3_K, func(b []byte) {
			f16(b, 108, 1)
			for i := 0; i < 32; i++ {
				b[i] = 0xFF // every high bit set: q = low2
			}
			// scale of t=13: low nibble scales[5]>>4, high bits scales[8+1]>>6.
			b[96+5] = 0x30 // low 3
			b[96+9] = 2 << 6
			b[32+32+16+1] = 2 << 4 // value 128+64+17, h=1 j=2 l=17: q = 2
		}, map[int]float32{128 + 64 + 17: float32((3|2<<4)-32) * 2}, 13, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := make([]byte, tc.dt.BlockBytes())
			tc.build(b)
			xs, err := Dequantize(tc.dt, b, 0)
			require.NoError(t, err)
			subLen := 16
			if tc.dt == Q4_K || tc.dt == Q5_K {
				subLen = 32
			}
			for i, x := range xs {
				want, ok := tc.want[i]
				switch {
				case ok:
				case i/subLen == tc.sub:
					want = tc.rest
				default:
					want = 0
				}
				require.Equalf(t, want, x, "value %d", i)
			}
		})
	}
}

// TestKQuantRoundTrip bounds the error of quantize→dequantize on Gaussian rows relative to the
// row's RMS; the bounds are a little above what ggml's quantizers reach (about 0.07, 0.035,
// 0.017, 0.16, 0.11 of the RMS for Q4_K, Q5_K, Q6_K, Q2_K, Q3_K).
func TestKQuantRoundTrip(t *testing.T) {
	bound := map[DType]float64{Q4_K: 0.1, Q5_K: 0.05, Q6_K: 0.025, Q2_K: 0.35, Q3_K: 0.2}
	r := rand.New(rand.NewPCG(1, 2))
	xs := make([]float32, 8*QKK)
	var ss float64
	for i := range xs {
		xs[i] = float32(r.NormFloat64())
		ss += float64(xs[i]) * float64(xs[i])
	}
	rms := math.Sqrt(ss / float64(len(xs)))
	for _, dt := range kquants {
		t.Run(dt.String(), func(t *testing.T) {
			ys := roundTrip(t, dt, xs, 0)
			var e float64
			for i := range xs {
				d := float64(xs[i] - ys[i])
				e += d * d
			}
			rel := math.Sqrt(e/float64(len(xs))) / rms
			assert.Less(t, rel, bound[dt])
			assert.Greater(t, rel, 0.0) // a lossless result would mean the codes were not used
		})
	}
}

func TestKQuantErrors(t *testing.T) {
	for _, dt := range kquants {
		_, err := Quantize(dt, make([]float32, QKK+32), 0)
		require.ErrorIs(t, err, ErrInvalidArgument, dt)
		_, err = Dequantize(dt, make([]byte, dt.BlockBytes()+1), 0)
		require.ErrorIs(t, err, ErrInvalidArgument, dt)
		b, err := Quantize(dt, nil, 0)
		require.NoError(t, err, dt)
		require.Empty(t, b)
	}
}

// FuzzKQuantDecode: any bytes of whole super-blocks decode without panicking, to one value per
// element; finite scales give finite values.
func FuzzKQuantDecode(f *testing.F) {
	f.Add(uint8(0), make([]byte, 144))
	f.Add(uint8(2), make([]byte, 420))
	f.Fuzz(func(t *testing.T, k uint8, b []byte) {
		dt := kquants[int(k)%len(kquants)]
		bs := int(dt.BlockBytes())
		b = b[:len(b)/bs*bs]
		xs, err := Dequantize(dt, b, 0)
		require.NoError(t, err)
		require.Len(t, xs, len(b)/bs*QKK)
	})
}

// FuzzKQuantEncode: quantizing finite values never panics and round-trips within the block's
// range (a K-quant value never lies far outside [min(x), max(x)] of its super-block).
func FuzzKQuantEncode(f *testing.F) {
	f.Add(uint8(0), int64(1), float32(1))
	f.Add(uint8(4), int64(7), float32(1e-30))
	f.Fuzz(func(t *testing.T, k uint8, seed int64, scale float32) {
		if scale != scale || math.IsInf(float64(scale), 0) || absf(scale) > 1e30 {
			return
		}
		dt := kquants[int(k)%len(kquants)]
		r := rand.New(rand.NewPCG(uint64(seed), 3))
		xs := make([]float32, QKK)
		lo, hi := float32(0), float32(0)
		for i := range xs {
			xs[i] = float32(r.NormFloat64()) * scale
			lo, hi = min(lo, xs[i]), max(hi, xs[i])
		}
		b, err := Quantize(dt, xs, 0)
		require.NoError(t, err)
		ys, err := Dequantize(dt, b, 0)
		require.NoError(t, err)
		span := float64(hi-lo) + 1e-30
		for i, y := range ys {
			require.False(t, math.IsNaN(float64(y)), "value %d", i)
			require.LessOrEqual(t, float64(y), float64(hi)+span, "value %d", i)
			require.GreaterOrEqual(t, float64(y), float64(lo)-span, "value %d", i)
		}
	})
}

// BenchmarkKQuant measures the reference quantizers and decoders per super-block row of 4096
// values (go test -bench KQuant ./core/); the bytes/s are of f32 input (quantize) or output
// (dequantize).
func BenchmarkKQuant(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 9))
	xs := make([]float32, 4096)
	for i := range xs {
		xs[i] = float32(r.NormFloat64())
	}
	for _, dt := range kquants {
		q, err := Quantize(dt, xs, 0)
		require.NoError(b, err)
		b.Run("quantize/"+dt.String(), func(b *testing.B) {
			b.SetBytes(int64(4 * len(xs)))
			for b.Loop() {
				_, _ = Quantize(dt, xs, 0)
			}
		})
		b.Run("dequantize/"+dt.String(), func(b *testing.B) {
			b.SetBytes(int64(4 * len(xs)))
			for b.Loop() {
				_, _ = Dequantize(dt, q, 0)
			}
		})
	}
}

// Non-finite inputs give unspecified codes (OPS.md) but never a panic or a wrong length.
func TestKQuantNonFinite(t *testing.T) {
	inf := float32(math.Inf(1))
	for _, dt := range kquants {
		for _, bad := range []float32{float32(math.NaN()), inf, -inf, 3e38, 1e-45} {
			xs := make([]float32, QKK)
			for i := range xs {
				xs[i] = float32(i%7) - 3
			}
			xs[5], xs[200] = bad, -bad
			b, err := Quantize(dt, xs, 0)
			require.NoError(t, err)
			require.Len(t, b, int(dt.BlockBytes()))
			ys, err := Dequantize(dt, b, 0)
			require.NoError(t, err)
			require.Len(t, ys, QKK)
		}
	}
}
