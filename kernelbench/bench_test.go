package kernelbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched/energy"
)

// threads is the thread count of every contender (XPU_BENCH_THREADS, default 2).
func threads() int {
	if n, err := strconv.Atoi(os.Getenv("XPU_BENCH_THREADS")); err == nil && n > 0 {
		return n
	}
	return 2
}

// neonOnce opens XPU_BENCH_PLUGIN (a plugin file, e.g. the portable build) or else the best
// NEON build discovery finds.
var neonOnce = sync.OnceValues(func() (core.Backend, error) {
	target := os.Getenv("XPU_BENCH_PLUGIN")
	if target == "" {
		target = "neon"
	}
	return loader.Open(context.Background(), target)
})

func device(b *testing.B, name string) core.Device {
	b.Helper()
	if name == "ref" {
		return ref.New().Devices()[0]
	}
	be, err := neonOnce()
	if err != nil {
		b.Skipf("neon plugin not available (run `make plugins`): %v", err)
	}
	return be.Devices()[0]
}

var harnessOnce = sync.OnceValues(func() (*Harness, error) {
	path := os.Getenv("XPU_BENCH_HARNESS")
	if path == "" {
		path = filepath.Join("..", "build", "bench", "libxpubench.so")
	}
	return LoadHarness(path)
})

func loadHarness(b *testing.B) *Harness {
	b.Helper()
	h, err := harnessOnce()
	if err != nil {
		b.Skipf("OpenBLAS harness not available: %v", err)
	}
	return h
}

// matmulRun prepares s on dev and returns one synchronous run.
func matmulRun(b *testing.B, dev core.Device, s Shape, dt core.DType) func() {
	return matmulRunWith(b, dev, nil, s, dt)
}

// matmulRunWith is matmulRun in a context with extra options (the thread count is added).
func matmulRunWith(b *testing.B, dev core.Device, opts map[string]string, s Shape, dt core.DType) func() {
	b.Helper()
	o := map[string]string{"threads": strconv.Itoa(threads())}
	for k, v := range opts {
		o[k] = v
	}
	m, err := NewMatMulWith(context.Background(), dev, o, s, dt)
	require.NoError(b, err)
	b.Cleanup(m.Close)
	return func() {
		if err := m.Run(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// cpuTime is the CPU time (user + system) the process has used so far.
func cpuTime() time.Duration {
	t, _ := energy.ProcessCPUTime() // 0 where the platform does not say
	return t
}

// timed runs f b.N times after one warm-up run and returns the elapsed time. It also reports
// the CPU seconds per run ("cpu-s/op"): on a machine shared with other work, wall time swings
// with the other tenants while the CPU time a kernel needs stays about the same, so ratios of
// CPU time between contenders survive a noisy machine.
func timed(b *testing.B, f func()) time.Duration {
	f()
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	for i := 0; i < b.N; i++ {
		f()
	}
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/op")
	return elapsed
}

func reportGFLOPS(b *testing.B, s Shape, elapsed time.Duration) {
	b.ReportMetric(s.FLOP()*float64(b.N)/elapsed.Seconds()/1e9, "GFLOP/s")
}

func reportGBs(b *testing.B, bytes int64, elapsed time.Duration) {
	b.ReportMetric(float64(bytes)*float64(b.N)/elapsed.Seconds()/1e9, "GB/s")
}

// BenchmarkGEMM: f32 a × f32 wᵀ at prefill shapes, in GFLOP/s.
func BenchmarkGEMM(b *testing.B) {
	for _, s := range GEMMShapes {
		for _, who := range []string{"neon", "openblas", "ref"} {
			b.Run(fmt.Sprintf("%s/%s", s, who), func(b *testing.B) {
				var run func()
				switch who {
				case "openblas":
					h := loadHarness(b)
					a, c := make([]float32, s.M*s.K), make([]float32, s.M*s.N)
					wb, err := Weights(core.F32, s.N, s.K)
					require.NoError(b, err)
					w := core.DecodeF32(wb)
					run = func() { require.NoError(b, h.SGEMM(s, a, w, c, threads())) }
				case "ref":
					if s.FLOP() > refMaxFLOP {
						b.Skipf("the reference would need minutes per iteration at %s", s)
					}
					run = matmulRun(b, device(b, who), s, core.F32)
				default:
					run = matmulRun(b, device(b, who), s, core.F32)
				}
				reportGFLOPS(b, s, timed(b, run))
			})
		}
	}
}

// BenchmarkGEMMChunk: a 32-token prefill chunk (the llm runtime's default) on a 4096x4096
// weight, f32 and f16: small M, where packing B costs as much as the product.
func BenchmarkGEMMChunk(b *testing.B) {
	s := Shape{32, 4096, 4096}
	for _, dt := range []core.DType{core.F32, core.F16} {
		b.Run(fmt.Sprintf("%s/%s/neon", s, dt), func(b *testing.B) {
			reportGFLOPS(b, s, timed(b, matmulRun(b, device(b, "neon"), s, dt)))
		})
	}
}

// quantVariants are the NEON contexts the quantized benchmarks compare: weights repacked at
// prepare (the default) and kept in their GGUF layout (repack=0, the kernels before issue 13).
var quantVariants = []struct {
	name string
	opts map[string]string
}{{"neon", nil}, {"neon-unpacked", map[string]string{"repack": "0"}}}

// BenchmarkGEMMQuant: prefill with Q8_0/Q4_0 weights (activations quantized on the fly, int8
// dot products), in GFLOP/s of the equivalent float product, at the chunk sizes a prefill uses.
func BenchmarkGEMMQuant(b *testing.B) {
	for _, s := range []Shape{{32, 2048, 2048}, GEMMShapes[0], {512, 2048, 2048}} {
		for _, dt := range []core.DType{core.Q8_0, core.Q4_0} {
			for _, v := range quantVariants {
				b.Run(fmt.Sprintf("%s/%s/%s", s, dt, v.name), func(b *testing.B) {
					reportGFLOPS(b, s, timed(b, matmulRunWith(b, device(b, "neon"), v.opts, s, dt)))
				})
			}
		}
	}
}

// BenchmarkGEMV: one activation row times a weight matrix, in GB/s of weights streamed (the
// decode roofline is the read bandwidth below).
func BenchmarkGEMV(b *testing.B) {
	for _, s := range GEMVShapes {
		for _, dt := range GEMVTypes {
			for _, who := range []string{"neon", "ref"} {
				b.Run(fmt.Sprintf("%s/%s/%s", s, dt, who), func(b *testing.B) {
					reportGBs(b, dt.Bytes(s.N*s.K), timed(b, matmulRun(b, device(b, who), s, dt)))
				})
			}
		}
	}
}

// KQuantGEMVShapes are the issue-14 shapes for the K-quant GEMV: a 4096 square and the 1B
// model's FFN up (5632x2048) and down (2048x5632) projections.
var KQuantGEMVShapes = []Shape{{1, 4096, 4096}, {1, 5632, 2048}, {1, 2048, 5632}}

// BenchmarkGEMVKQuant: decode GEMV with K-quant weights next to Q4_0 and Q8_0 on the same
// shapes, in GB/s of the weights' GGUF bytes (the repacked copy is 148 B per 256 values for
// Q4_K against 144, 180 for Q5_K against 176, 210 for Q6_K). Sub-benchmarks of one shape run
// back to back; -count N repeats the whole set, so the rounds of the contenders interleave.
func BenchmarkGEMVKQuant(b *testing.B) {
	for _, s := range KQuantGEMVShapes {
		for _, dt := range []core.DType{core.Q4_0, core.Q4_K, core.Q5_K, core.Q6_K, core.Q8_0} {
			b.Run(fmt.Sprintf("%s/%s/neon", s, dt), func(b *testing.B) {
				reportGBs(b, dt.Bytes(s.N*s.K), timed(b, matmulRun(b, device(b, "neon"), s, dt)))
			})
		}
	}
}

// BenchmarkGEMMKQuant: prefill with K-quant weights next to Q4_0 (activations quantized to
// Q8_K-like blocks, int8 kernels on the repacked weights), in GFLOP/s, at a 32-row chunk and
// at 128 rows.
func BenchmarkGEMMKQuant(b *testing.B) {
	for _, s := range []Shape{{32, 2048, 2048}, {128, 2048, 2048}} {
		for _, dt := range []core.DType{core.Q4_0, core.Q4_K, core.Q5_K, core.Q6_K} {
			b.Run(fmt.Sprintf("%s/%s/neon", s, dt), func(b *testing.B) {
				reportGFLOPS(b, s, timed(b, matmulRun(b, device(b, "neon"), s, dt)))
			})
		}
	}
}

// BenchmarkGEMVCold: quantized GEMV on weights larger than the LLC, against the read bandwidth,
// with the weights repacked at prepare and in their GGUF layout.
func BenchmarkGEMVCold(b *testing.B) {
	for _, dt := range []core.DType{core.Q8_0, core.Q4_0} {
		for _, v := range quantVariants {
			b.Run(fmt.Sprintf("%s/%s/%s", ColdShape, dt, v.name), func(b *testing.B) {
				reportGBs(b, dt.Bytes(ColdShape.N*ColdShape.K), timed(b, matmulRunWith(b, device(b, "neon"), v.opts, ColdShape, dt)))
			})
		}
	}
}

// BenchmarkAttentionDecode: one query row (32 heads of 128) over a 4096-entry f16 KV cache
// with 8 KV heads, in GB/s of K and V read: decode's attention is a stream over the cache.
func BenchmarkAttentionDecode(b *testing.B) {
	const hq, hkv, d, tk = 32, 8, 128, 4096
	ctx := context.Background()
	g := core.NewGraph()
	q := g.Input("q", core.F32, 1, hq, d)
	k := g.Input("k", core.F16, tk, hkv, d)
	v := g.Input("v", core.F16, tk, hkv, d)
	g.Output(g.Attention(q, k, v, core.AttentionOptions{Causal: true, QOffset: tk - 1}))
	cctx, err := device(b, "neon").NewContext(ctx, map[string]string{"threads": strconv.Itoa(threads())})
	require.NoError(b, err)
	exe, err := cctx.Prepare(ctx, g)
	require.NoError(b, err)
	ex, err := exe.NewExecution()
	require.NoError(b, err)
	var bufs []core.Buffer
	for io, size := range []int64{4 * hq * d, 2 * tk * hkv * d, 2 * tk * hkv * d, 4 * hq * d} {
		buf, err := cctx.Alloc(size, core.BufferDevice)
		require.NoError(b, err)
		require.NoError(b, ex.Bind(io, buf, 0))
		bufs = append(bufs, buf)
	}
	defer func() {
		_ = ex.Close()
		_ = exe.Close()
		for _, buf := range bufs {
			_ = buf.Close()
		}
		_ = cctx.Close()
	}()
	elapsed := timed(b, func() { require.NoError(b, ex.Run(ctx)) })
	reportGBs(b, 2*2*tk*hkv*d, elapsed)
}

// BenchmarkNodeOverhead: a chain of 200 tiny nodes, in ns per node: the fixed cost a decode
// step pays for every op of the model, whatever its size.
func BenchmarkNodeOverhead(b *testing.B) {
	const nodes = 200
	ctx := context.Background()
	g := core.NewGraph()
	x := g.Input("x", core.F32, 64)
	y := x
	for i := 0; i < nodes; i++ {
		y = g.Scale(y, 1.0001, 0)
	}
	g.Output(y)
	cctx, err := device(b, "neon").NewContext(ctx, map[string]string{"threads": strconv.Itoa(threads())})
	require.NoError(b, err)
	exe, err := cctx.Prepare(ctx, g)
	require.NoError(b, err)
	ex, err := exe.NewExecution()
	require.NoError(b, err)
	in, err := cctx.Alloc(256, core.BufferDevice)
	require.NoError(b, err)
	out, err := cctx.Alloc(256, core.BufferDevice)
	require.NoError(b, err)
	require.NoError(b, ex.Bind(0, in, 0))
	require.NoError(b, ex.Bind(1, out, 0))
	defer func() {
		_ = ex.Close()
		_ = exe.Close()
		_ = in.Close()
		_ = out.Close()
		_ = cctx.Close()
	}()
	elapsed := timed(b, func() { require.NoError(b, ex.Run(ctx)) })
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N*nodes), "ns/node")
}

// BenchmarkReadBandwidth: STREAM-style read-only bandwidth over 512 MiB (about 5x the LLC of
// the reference machine) with the benchmark's thread count: the GEMV roofline.
func BenchmarkReadBandwidth(b *testing.B) {
	h := loadHarness(b)
	buf := make([]uint64, 64<<20)
	for i := range buf {
		buf[i] = uint64(i)
	}
	reportGBs(b, int64(8*len(buf)), timed(b, func() { h.Read(buf, threads()) }))
}

// TestSuiteQuick runs the suite of `xpu bench --quick` on a tiny budget: it must produce a
// figure for every contender it was given and no error.
func TestSuiteQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("times real kernels")
	}
	be, err := neonOnce()
	if err != nil {
		required.Skip(t, "neon", "neon plugin not available: %v", err)
	}
	GEMMShapes, GEMVShapes = []Shape{{8, 64, 64}}, []Shape{{1, 64, 64}}
	defer func() {
		GEMMShapes = []Shape{{128, 2048, 2048}, {512, 4096, 4096}}
		GEMVShapes = []Shape{{1, 4096, 4096}, {1, 11008, 4096}}
	}()
	rows, err := Suite(context.Background(), Options{Device: be.Devices()[0], Ref: ref.New().Devices()[0], Quick: true,
		MinTime: time.Millisecond})
	require.NoError(t, err)
	require.Len(t, rows, 2+2*len(GEMVTypes))
	for _, r := range rows {
		require.Positive(t, r.Value, "%+v", r)
	}
}
