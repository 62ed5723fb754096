package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/loader"
)

// threads is the thread count of every contender (XPU_BENCH_THREADS, default 2).
func threads() int {
	if n, err := strconv.Atoi(os.Getenv("XPU_BENCH_THREADS")); err == nil && n > 0 {
		return n
	}
	return 2
}

type shape struct{ M, N, K int64 }

func (s shape) String() string { return fmt.Sprintf("%dx%dx%d", s.M, s.N, s.K) }

var (
	gemmShapes = []shape{{128, 2048, 2048}, {512, 4096, 4096}}
	gemvShapes = []shape{{1, 4096, 4096}, {1, 11008, 4096}}
	gemvTypes  = []core.DType{core.F32, core.F16, core.Q8_0, core.Q4_0}
	// coldShape's quantized weights (151 MB Q4_0, 285 MB Q8_0) exceed even a 105 MB LLC, so
	// its GEMV reads DRAM like a real model's decode does.
	coldShape = shape{1, 16384, 16384}
)

// refMaxFLOP bounds the shapes the float64 reference is timed on: it runs at a few hundred
// MFLOP/s, and one iteration of the largest GEMM would take minutes.
const refMaxFLOP = 2.2e9

// ---------------------------------------------------------------- backends

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

// weights are random, cached per (dtype, N, K): generating 180 MB takes longer than a run.
var weightCache sync.Map

func weights(dt core.DType, n, k int64) []byte {
	key := fmt.Sprintf("%s/%d/%d", dt, n, k)
	if w, ok := weightCache.Load(key); ok {
		return w.([]byte)
	}
	rng := rand.New(rand.NewPCG(uint64(n), uint64(k)))
	xs := make([]float32, n*k)
	for i := range xs {
		xs[i] = rng.Float32()*2 - 1
	}
	var data []byte
	if dt == core.F32 {
		data = core.EncodeF32(xs)
	} else {
		var err error
		if data, err = core.Quantize(dt, xs, 0); err != nil {
			panic(err)
		}
	}
	weightCache.Store(key, data)
	return data
}

// matmulRun prepares out = a · wᵀ on dev with a constant w and returns one synchronous run.
func matmulRun(b *testing.B, dev core.Device, s shape, dt core.DType) func() {
	b.Helper()
	ctx := context.Background()
	g := core.NewGraph()
	a := g.Input("a", core.F32, s.M, s.K)
	w := g.Const("w", dt, core.Shape{s.N, s.K}, weights(dt, s.N, s.K))
	g.Output(g.MatMul(a, w))
	require.NoError(b, g.Err())
	cctx, err := dev.NewContext(ctx, map[string]string{"threads": strconv.Itoa(threads())})
	require.NoError(b, err)
	exe, err := cctx.Prepare(ctx, g)
	require.NoError(b, err)
	ex, err := exe.NewExecution()
	require.NoError(b, err)
	in, err := cctx.Alloc(4*s.M*s.K, core.BufferDevice)
	require.NoError(b, err)
	rng := rand.New(rand.NewPCG(1, 2))
	xs := make([]float32, s.M*s.K)
	for i := range xs {
		xs[i] = rng.Float32()*2 - 1
	}
	require.NoError(b, in.Write(0, core.EncodeF32(xs)))
	out, err := cctx.Alloc(4*s.M*s.N, core.BufferDevice)
	require.NoError(b, err)
	require.NoError(b, ex.Bind(0, in, 0))
	require.NoError(b, ex.Bind(1, out, 0))
	b.Cleanup(func() {
		_ = ex.Close()
		_ = exe.Close()
		_ = in.Close()
		_ = out.Close()
		_ = cctx.Close()
	})
	return func() {
		if err := ex.Run(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// ---------------------------------------------------------------- OpenBLAS harness

type harness struct {
	sgemm func(m, n, k int64, a, b, c *float32, threads int32)
	read  func(p *uint64, words uint64, threads int32) uint64
}

var harnessOnce = sync.OnceValues(func() (*harness, error) {
	path := os.Getenv("XPU_BENCH_HARNESS")
	if path == "" {
		path = filepath.Join("..", "build", "bench", "libxpubench.so")
	}
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (build it with `make bench-neon`)", path, err)
	}
	h := &harness{}
	purego.RegisterLibFunc(&h.sgemm, lib, "xb_sgemm")
	purego.RegisterLibFunc(&h.read, lib, "xb_read")
	return h, nil
})

func loadHarness(b *testing.B) *harness {
	b.Helper()
	h, err := harnessOnce()
	if err != nil {
		b.Skipf("OpenBLAS harness not available: %v", err)
	}
	return h
}

// ---------------------------------------------------------------- benchmarks

func reportGFLOPS(b *testing.B, s shape, elapsed time.Duration) {
	b.ReportMetric(2*float64(s.M*s.N*s.K)*float64(b.N)/elapsed.Seconds()/1e9, "GFLOP/s")
}

// BenchmarkGEMM: f32 a × f32 wᵀ at prefill shapes, in GFLOP/s.
func BenchmarkGEMM(b *testing.B) {
	for _, s := range gemmShapes {
		for _, who := range []string{"neon", "openblas", "ref"} {
			b.Run(fmt.Sprintf("%s/%s", s, who), func(b *testing.B) {
				var run func()
				switch who {
				case "openblas":
					h := loadHarness(b)
					a := make([]float32, s.M*s.K)
					c := make([]float32, s.M*s.N)
					w := core.DecodeF32(weights(core.F32, s.N, s.K))
					run = func() { h.sgemm(s.M, s.N, s.K, &a[0], &w[0], &c[0], int32(threads())) }
				case "ref":
					if 2*float64(s.M*s.N*s.K) > refMaxFLOP {
						b.Skipf("the reference would need minutes per iteration at %s", s)
					}
					run = matmulRun(b, device(b, who), s, core.F32)
				default:
					run = matmulRun(b, device(b, who), s, core.F32)
				}
				run() // warm caches and page in the weights
				b.ResetTimer()
				start := time.Now()
				for i := 0; i < b.N; i++ {
					run()
				}
				reportGFLOPS(b, s, time.Since(start))
			})
		}
	}
}

// BenchmarkGEMMQuant: prefill with Q8_0/Q4_0 weights (activations quantized on the fly, int8
// dot products), in GFLOP/s of the equivalent float product.
func BenchmarkGEMMQuant(b *testing.B) {
	s := gemmShapes[0]
	for _, dt := range []core.DType{core.Q8_0, core.Q4_0} {
		b.Run(fmt.Sprintf("%s/%s/neon", s, dt), func(b *testing.B) {
			run := matmulRun(b, device(b, "neon"), s, dt)
			run()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				run()
			}
			reportGFLOPS(b, s, time.Since(start))
		})
	}
}

// BenchmarkGEMV: one activation row times a weight matrix much larger than the LLC, in GB/s
// of weights streamed (the decode roofline is the read bandwidth below).
func BenchmarkGEMV(b *testing.B) {
	for _, s := range gemvShapes {
		for _, dt := range gemvTypes {
			for _, who := range []string{"neon", "ref"} {
				b.Run(fmt.Sprintf("%s/%s/%s", s, dt, who), func(b *testing.B) {
					run := matmulRun(b, device(b, who), s, dt)
					run()
					b.ResetTimer()
					start := time.Now()
					for i := 0; i < b.N; i++ {
						run()
					}
					bytes := float64(dt.Bytes(s.N*s.K)) * float64(b.N)
					b.ReportMetric(bytes/time.Since(start).Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}

// BenchmarkGEMVCold: quantized GEMV on weights larger than any LLC, against the read bandwidth.
func BenchmarkGEMVCold(b *testing.B) {
	for _, dt := range []core.DType{core.Q8_0, core.Q4_0} {
		b.Run(fmt.Sprintf("%s/%s/neon", coldShape, dt), func(b *testing.B) {
			run := matmulRun(b, device(b, "neon"), coldShape, dt)
			run()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				run()
			}
			bytes := float64(dt.Bytes(coldShape.N*coldShape.K)) * float64(b.N)
			b.ReportMetric(bytes/time.Since(start).Seconds()/1e9, "GB/s")
		})
	}
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
	dev := device(b, "neon")
	cctx, err := dev.NewContext(ctx, map[string]string{"threads": strconv.Itoa(threads())})
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
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		require.NoError(b, ex.Run(ctx))
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*nodes), "ns/node")
}

// BenchmarkReadBandwidth: STREAM-style read-only bandwidth over 512 MiB (about 5x the LLC of
// the reference machine) with the benchmark's thread count: the GEMV roofline.
func BenchmarkReadBandwidth(b *testing.B) {
	h := loadHarness(b)
	buf := make([]uint64, 64<<20)
	for i := range buf {
		buf[i] = uint64(i)
	}
	h.read(&buf[0], uint64(len(buf)), int32(threads()))
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		h.read(&buf[0], uint64(len(buf)), int32(threads()))
	}
	b.ReportMetric(float64(8*len(buf))*float64(b.N)/time.Since(start).Seconds()/1e9, "GB/s")
}
