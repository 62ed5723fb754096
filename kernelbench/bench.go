package kernelbench

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ebitengine/purego"

	"github.com/xpuhub/xpu/core"
)

// Shape is a MATMUL a[M,K] · w[N,K]ᵀ.
type Shape struct{ M, N, K int64 }

func (s Shape) String() string { return fmt.Sprintf("%dx%dx%d", s.M, s.N, s.K) }

// FLOP is the multiply-adds of one product, counted as two operations each.
func (s Shape) FLOP() float64 { return 2 * float64(s.M) * float64(s.N) * float64(s.K) }

// The shapes the suite times.
var (
	GEMMShapes = []Shape{{128, 2048, 2048}, {512, 4096, 4096}}
	GEMVShapes = []Shape{{1, 4096, 4096}, {1, 11008, 4096}}
	GEMVTypes  = []core.DType{core.F32, core.F16, core.Q8_0, core.Q4_0}
	// ColdShape's quantized weights (302 MB Q4_0, 570 MB Q8_0) exceed even a 260 MB LLC, so its
	// GEMV reads DRAM like a real model's decode does.
	ColdShape = Shape{1, 32768, 16384}
)

// weightCache keeps generated weights per (dtype, N, K): generating 180 MB takes longer than
// running on them.
var weightCache sync.Map

// Weights returns deterministic random weights [N, K] of dt (F32, F16, BF16, Q8_0, Q4_0, or a
// K-quant: random codes and scales, see KQuantWeights).
func Weights(dt core.DType, n, k int64) ([]byte, error) {
	key := fmt.Sprintf("%s/%d/%d", dt, n, k)
	if w, ok := weightCache.Load(key); ok {
		return w.([]byte), nil
	}
	if dt.KQuant() {
		data, err := KQuantWeights(dt, n, k)
		if err != nil {
			return nil, err
		}
		weightCache.Store(key, data)
		return data, nil
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
			return nil, fmt.Errorf("bench: weights: %w", err)
		}
	}
	weightCache.Store(key, data)
	return data, nil
}

// KQuantWeights returns deterministic K-quant weights [N, K] (K a multiple of 256) made of
// random bytes with each super-block's f16 scales set to small normal values (2^-8..2^-7): a
// kernel's speed does not depend on the codes, and quantizing hundreds of MB of floats with the
// K-quants' scale search would take longer than the benchmark.
func KQuantWeights(dt core.DType, n, k int64) ([]byte, error) {
	if !dt.KQuant() || k%core.QKK != 0 || n < 0 {
		return nil, fmt.Errorf("bench: %s weights [%d, %d]: need a K-quant and K a multiple of %d", dt, n, k, core.QKK)
	}
	bb := dt.BlockBytes()
	data := make([]byte, n*(k/core.QKK)*bb)
	rng := rand.New(rand.NewPCG(uint64(n), uint64(k)))
	for i := 0; i+8 <= len(data); i += 8 {
		binary.LittleEndian.PutUint64(data[i:], rng.Uint64())
	}
	// byte offsets of the f16 scale fields (abi/OPS.md, K-quants)
	var halves []int64
	switch dt {
	case core.Q4_K, core.Q5_K:
		halves = []int64{0, 2}
	case core.Q6_K:
		halves = []int64{208}
	case core.Q2_K:
		halves = []int64{80, 82}
	case core.Q3_K:
		halves = []int64{108}
	}
	for b := int64(0); b < int64(len(data)); b += bb {
		for _, off := range halves {
			binary.LittleEndian.PutUint16(data[b+off:], 0x1C00|uint16(rng.IntN(0x400)))
		}
	}
	return data, nil
}

// MatMul is a prepared out = a · wᵀ with a constant w on one device, bound and ready to run.
type MatMul struct {
	cctx    core.Context
	exe     core.Executable
	ex      core.Execution
	in, out core.Buffer
}

// NewMatMul prepares s with weights of dt on dev, in a context of the given thread count.
func NewMatMul(ctx context.Context, dev core.Device, threads int, s Shape, dt core.DType) (*MatMul, error) {
	return NewMatMulWith(ctx, dev, map[string]string{"threads": fmt.Sprint(threads)}, s, dt)
}

// NewMatMulWith is NewMatMul in a context made with the given options (e.g. the NEON plugin's
// repack=0, which keeps quantized weights in their GGUF layout, to compare both kernels).
func NewMatMulWith(ctx context.Context, dev core.Device, opts map[string]string, s Shape, dt core.DType) (*MatMul, error) {
	w, err := Weights(dt, s.N, s.K)
	if err != nil {
		return nil, err
	}
	g := core.NewGraph()
	a := g.Input("a", core.F32, s.M, s.K)
	g.Output(g.MatMul(a, g.Const("w", dt, core.Shape{s.N, s.K}, w)))
	if err := g.Err(); err != nil {
		return nil, err
	}
	m := &MatMul{}
	fail := func(err error) (*MatMul, error) {
		m.Close()
		return nil, fmt.Errorf("bench: matmul %s %s on %s: %w", s, dt, dev.Info().ID(), err)
	}
	if m.cctx, err = dev.NewContext(ctx, opts); err != nil {
		return fail(err)
	}
	if m.exe, err = m.cctx.Prepare(ctx, g); err != nil {
		return fail(err)
	}
	if m.ex, err = m.exe.NewExecution(); err != nil {
		return fail(err)
	}
	if m.in, err = m.cctx.Alloc(4*s.M*s.K, core.BufferDevice); err != nil {
		return fail(err)
	}
	if m.out, err = m.cctx.Alloc(4*s.M*s.N, core.BufferDevice); err != nil {
		return fail(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	xs := make([]float32, s.M*s.K)
	for i := range xs {
		xs[i] = rng.Float32()*2 - 1
	}
	if err := m.in.Write(0, core.EncodeF32(xs)); err != nil {
		return fail(err)
	}
	if err := m.ex.Bind(0, m.in, 0); err != nil {
		return fail(err)
	}
	if err := m.ex.Bind(1, m.out, 0); err != nil {
		return fail(err)
	}
	return m, nil
}

// Run executes the product once, synchronously.
func (m *MatMul) Run(ctx context.Context) error { return m.ex.Run(ctx) }

// Close releases everything NewMatMul made (safe on a partly built MatMul).
func (m *MatMul) Close() {
	if m.ex != nil {
		_ = m.ex.Close()
	}
	if m.exe != nil {
		_ = m.exe.Close()
	}
	if m.in != nil {
		_ = m.in.Close()
	}
	if m.out != nil {
		_ = m.out.Close()
	}
	if m.cctx != nil {
		_ = m.cctx.Close()
	}
}

// Harness is the C side of the benchmark (kernelbench/harness/harness.c, built by `make bench-neon`
// into build/bench/libxpubench.so): OpenBLAS's sgemm and a STREAM-style read loop.
type Harness struct {
	sgemm func(m, n, k int64, a, b, c *float32, threads int32)
	read  func(p *uint64, words uint64, threads int32) uint64
}

// LoadHarness opens the harness library at path.
func LoadHarness(path string) (*Harness, error) {
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w (build it with `make bench-neon`): %w", path, err, core.ErrNotFound)
	}
	h := &Harness{}
	purego.RegisterLibFunc(&h.sgemm, lib, "xb_sgemm")
	purego.RegisterLibFunc(&h.read, lib, "xb_read")
	return h, nil
}

// SGEMM runs OpenBLAS's c = a · wᵀ for s with the given thread count.
func (h *Harness) SGEMM(s Shape, a, w, c []float32, threads int) error {
	if int64(len(a)) < s.M*s.K || int64(len(w)) < s.N*s.K || int64(len(c)) < s.M*s.N || len(a) == 0 ||
		len(w) == 0 || len(c) == 0 {
		return fmt.Errorf("bench: sgemm %s: slices too short: %w", s, core.ErrInvalidArgument)
	}
	h.sgemm(s.M, s.N, s.K, &a[0], &w[0], &c[0], int32(threads))
	return nil
}

// Read sums buf with the given thread count (the result defeats dead-code elimination).
func (h *Harness) Read(buf []uint64, threads int) uint64 {
	if len(buf) == 0 {
		return 0
	}
	return h.read(&buf[0], uint64(len(buf)), int32(threads))
}

// Time runs f at least minIters times and for at least minTime (after one warm-up run) and
// returns the mean time of one run.
func Time(ctx context.Context, f func() error, minIters int, minTime time.Duration) (time.Duration, error) {
	if err := f(); err != nil {
		return 0, err
	}
	start := time.Now()
	n := 0
	for n < minIters || time.Since(start) < minTime {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if err := f(); err != nil {
			return 0, err
		}
		n++
	}
	return time.Since(start) / time.Duration(n), nil
}
