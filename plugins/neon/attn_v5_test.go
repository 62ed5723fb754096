package neon_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/sched"
)

// v5Shape is one attention shape: query rows, query heads, KV heads, head sizes, cache length.
type v5Shape struct{ tq, hq, hkv, d, dv, tk int64 }

// v5Opts are the op set 5 options a case combines (with Scale 1, so that scores of inputs in
// [-1, 1] reach both forms of the soft-cap's tanh).
var v5Opts = []struct {
	name    string
	softCap float32
	window  int64
}{
	{"plain", 0, 0},
	{"softcap3", 3, 0},
	{"window37", 0, 37},
	{"softcap0.5_window16", 0.5, 16},
	{"window1", 0, 1},
}

// encodeAs writes xs in dtype dt (f32, f16, or Q8_0/Q4_0 through core.Quantize).
func encodeAs(t *testing.T, dt core.DType, xs []float32) []byte {
	t.Helper()
	switch dt {
	case core.F32:
		return core.EncodeF32(xs)
	case core.F16:
		b := make([]byte, 2*len(xs))
		for i, x := range xs {
			h := core.F32ToF16(x)
			b[2*i], b[2*i+1] = byte(h), byte(h>>8)
		}
		return b
	default:
		b, err := core.Quantize(dt, xs, 0)
		require.NoError(t, err)
		return b
	}
}

// poisonRows overwrites the cache rows [from, to) of a [tk, hkv, d] tensor of dtype dt with
// NaN (a NaN scale for Q8_0/Q4_0 blocks): a kernel that reads one of them, or gives it any
// weight, writes NaN.
func poisonRows(b []byte, dt core.DType, from, to, hkv, d int64) {
	rowBytes := dt.Bytes(hkv * d)
	for r := max(from, 0); r < min(to, int64(len(b))/rowBytes); r++ {
		row := b[r*rowBytes : (r+1)*rowBytes]
		switch dt {
		case core.F32:
			for i := 0; i+4 <= len(row); i += 4 {
				copy(row[i:], core.EncodeF32([]float32{float32(math.NaN())}))
			}
		case core.F16:
			for i := 0; i+2 <= len(row); i += 2 {
				row[i], row[i+1] = 0x00, 0x7E
			}
		default: // every block's f16 scale
			bb := int(dt.Bytes(32))
			for i := 0; i+bb <= len(row); i += bb {
				row[i], row[i+1] = 0x00, 0x7E
			}
		}
	}
}

// runAttentionV5 runs one attention case on dev and against core/ref. Rows of k and v outside
// every query's visible keys are set to NaN for the plugin (the reference gets clean ones), so
// the case also proves that the keys before a sliding window and past the last visible key
// are never read.
func runAttentionV5(t *testing.T, dev core.Device, name string, s v5Shape, kv core.DType, opt core.AttentionOptions,
	tol float64, ctxOpts map[string]string) {
	t.Run(name, func(t *testing.T) {
		ctx := context.Background()
		g := core.NewGraph()
		q := g.Input("q", core.F32, s.tq, s.hq, s.d)
		k := g.Input("k", kv, s.tk, s.hkv, s.d)
		v := g.Input("v", kv, s.tk, s.hkv, s.dv)
		g.Output(g.Attention(q, k, v, opt))
		require.NoError(t, g.Err())
		rng := rand.New(rand.NewPCG(uint64(len(name)), 11))
		qb := core.EncodeF32(randF32(rng, s.tq*s.hq*s.d))
		kb := encodeAs(t, kv, randF32(rng, s.tk*s.hkv*s.d))
		vb := encodeAs(t, kv, randF32(rng, s.tk*s.hkv*s.dv))
		want, err := ref.Run(ctx, g, [][]byte{qb, kb, vb})
		require.NoError(t, err)
		// keys the first row cannot see before its window, and past the last row's last key
		first := int64(0)
		if opt.Window > 0 {
			first = opt.QOffset - opt.Window + 1
		}
		last := opt.QOffset + s.tq // exclusive
		kp, vp := append([]byte(nil), kb...), append([]byte(nil), vb...)
		poisonRows(kp, kv, 0, first, s.hkv, s.d)
		poisonRows(vp, kv, 0, first, s.hkv, s.dv)
		poisonRows(kp, kv, last, s.tk, s.hkv, s.d)
		poisonRows(vp, kv, last, s.tk, s.hkv, s.dv)
		sess, err := sched.NewSession(ctx, g, []core.Device{dev}, sched.Strict(), sched.WithContextOptions(ctxOpts))
		require.NoError(t, err)
		defer sess.Close()
		got, err := sess.Run(ctx, [][]byte{qb, kp, vp})
		require.NoError(t, err)
		gv, wv := decodeAny(core.F32, got[0]), decodeAny(core.F32, want[0])
		require.Len(t, gv, len(wv))
		worst, at, peak := maxError(gv, wv)
		require.LessOrEqual(t, worst/peak, tol, "max error %g at element %d, peak %g", worst, at, peak)
	})
}

// TestAttentionV5Paths: op set 5's ATTENTION additions (soft-cap, sliding window, Q8_0/Q4_0 K
// and V) on every build and kernel path: decode rows (the keys-outer path; grouped heads by 4
// and by 3), chunks (the task path, rows whose windows start apart), small heads (the
// transposed-window paths, one- and two-pass on AVX2), head sizes with an odd number of
// 32-value blocks, a KV head range over a quantized cache, at 1 and 2 threads.
func TestAttentionV5Paths(t *testing.T) {
	shapes := []v5Shape{
		{1, 8, 2, 64, 64, 300}, {1, 32, 8, 128, 128, 100}, {1, 6, 2, 32, 32, 77},
		{5, 8, 4, 64, 64, 140}, {20, 4, 2, 96, 96, 90}, {3, 4, 2, 32, 64, 70},
		// small heads (float caches only: a quantized one needs multiples of 32)
		{5, 8, 4, 8, 8, 100}, {3, 4, 2, 12, 12, 70}, {1, 2, 1, 20, 16, 65}, {4, 2, 1, 8, 24, 90},
	}
	opts := v5Opts
	if raceEnabled || testing.Short() {
		// the Go side (core/ref) dominates under -race: the case that combines both options
		// only (make test-neon-conform runs the conformance suite's v5 cases on every build)
		opts = v5Opts[3:4]
	}
	for _, f := range pluginFiles(t) {
		dev := openUsable(t, f).Devices()[0]
		for _, kv := range []core.DType{core.F32, core.F16, core.Q8_0, core.Q4_0} {
			for _, s := range shapes {
				if kv.Quantized() && (s.d%32 != 0 || s.dv%32 != 0) {
					continue
				}
				tol := 1e-5
				if kv == core.F16 {
					tol = 2e-3
				}
				for _, o := range opts {
					opt := core.AttentionOptions{Causal: true, QOffset: s.tk - s.tq, Scale: 1, SoftCap: o.softCap, Window: o.window}
					name := fmt.Sprintf("%s/%dx%dx%d_kv%dx%dx%d_%s_%s", filepath.Base(f), s.tq, s.hq, s.d, s.tk, s.hkv, s.dv, kv, o.name)
					threads := map[string]string{"threads": "2"}
					if o.name == "window1" {
						threads = map[string]string{"threads": "1"}
					}
					runAttentionV5(t, dev, name, s, kv, opt, tol, threads)
				}
			}
			if kv.Quantized() { // the second and third of four KV heads, quantized rows strided
				s := v5Shape{1, 4, 4, 64, 64, 80}
				opt := core.AttentionOptions{Causal: true, QOffset: s.tk - 1, Scale: 1, SoftCap: 3, Window: 20,
					KVHeadOffset: 1, KVHeads: 2}
				runAttentionV5(t, dev, fmt.Sprintf("%s/headrange_%s", filepath.Base(f), kv), s, kv, opt, 1e-5,
					map[string]string{"threads": "2"})
			}
		}
	}
}

// TestAttentionWindowPastTheCache: windows and offsets at the edges: a window longer than the
// cache (every key visible, as without one), an offset before the cache (no key: zeros), an
// offset far past it (the window holds no cached key: zeros), a window of the whole cache.
func TestAttentionWindowPastTheCache(t *testing.T) {
	s := v5Shape{3, 4, 2, 32, 32, 50}
	cases := []struct {
		name        string
		off, window int64
	}{
		{"window_longer_than_cache", 47, 1000},
		{"offset_before_cache", -10, 4},
		{"window_past_cache", 500, 8},
		{"window_whole_cache", 47, 50},
		{"window_ends_at_cache_end", 60, 20},
	}
	for _, f := range pluginFiles(t) {
		dev := openUsable(t, f).Devices()[0]
		for _, kv := range []core.DType{core.F32, core.Q8_0} {
			for _, c := range cases {
				opt := core.AttentionOptions{Causal: true, QOffset: c.off, Window: c.window}
				runAttentionV5(t, dev, fmt.Sprintf("%s/%s_%s", filepath.Base(f), c.name, kv), s, kv, opt, 1e-5,
					map[string]string{"threads": "2"})
			}
		}
	}
}

// TestTanhKernel: TANH (op set 5) on both activation dtypes, over both forms of the vector
// tanh (|x| below and above 0.5, up to saturation) and a scalar tail.
func TestTanhKernel(t *testing.T) {
	ctx := context.Background()
	for _, f := range pluginFiles(t) {
		dev := openUsable(t, f).Devices()[0]
		for _, dt := range []core.DType{core.F32, core.F16} {
			for _, c := range []struct {
				n     int64
				scale float32
			}{{1003, 0.5}, {1000, 12}, {7, 3}} {
				tol := 1e-6
				if dt == core.F16 {
					tol = 1e-3
				}
				kc := kernelCase{
					name: fmt.Sprintf("tanh_%d_x%g_%s", c.n, c.scale, dt),
					tol:  tol,
					build: func(g *core.Graph, _ *rand.Rand) {
						x := g.Input("x", dt, c.n)
						g.Output(g.Tanh(g.Scale(x, c.scale, 0)))
					},
				}
				runKernelCase(t, ctx, dev, filepath.Base(f)+"/"+kc.name, kc, map[string]string{"threads": "2"})
			}
		}
	}
}
