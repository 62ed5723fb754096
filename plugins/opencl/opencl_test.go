package opencl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/conformance"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/loader"
)

// childEnv makes the test binary act as a fresh process (TestMain): the plugin keeps its
// libOpenCL and its built program for the life of a process, so probing without the library
// and measuring a cold start need processes of their own.
const childEnv = "XPU_OPENCL_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "probe":
		os.Exit(childProbe())
	case "start":
		os.Exit(childStart())
	}
	os.Exit(m.Run())
}

// pluginPath is build/plugins/libxpu-opencl.so of this checkout (make builds it).
func pluginPath(tb testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", "build", "plugins", "libxpu-opencl.so")
	if _, err := os.Stat(p); err != nil {
		required.Skip(tb, "opencl", "%s is not built (run make plugins): %v", p, err)
	}
	return p
}

// openBackend opens the plugin through the loader by name, or skips where no OpenCL device is.
func openBackend(tb testing.TB) core.Backend {
	path := pluginPath(tb)
	pr, err := abi.Probe(path)
	require.NoError(tb, err)
	if pr.Score <= 0 {
		required.Skip(tb, "opencl", "opencl probes 0 here: %s", pr.Reason)
	}
	b, err := loader.Open(context.Background(), "opencl", loader.WithPaths(path), loader.WithoutEnv())
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = b.Close() })
	return b
}

// openBenchBackend opens the plugin under test ("opencl") or a peer to compare it with in the
// same run (skipping when the peer is not built).
func openBenchBackend(b *testing.B, name string) core.Backend {
	if name == "opencl" {
		return openBackend(b)
	}
	be, err := loader.Open(context.Background(), name, loader.WithoutEnv())
	if err != nil {
		b.Skipf("%s: %v", name, err)
	}
	b.Cleanup(func() { _ = be.Close() })
	return be
}

func TestConformance(t *testing.T) {
	b := openBackend(t)
	rep, err := conformance.Run(context.Background(), b, conformance.WithPlugin(abi.PluginOf(b)))
	require.NoError(t, err)
	for _, c := range rep.Cases {
		if c.Status == conformance.StatusFail {
			t.Errorf("%s: %s %v", c.Name, c.Category, c.Errors)
		}
	}
	assert.Zero(t, rep.Failed)
	assert.Greater(t, rep.Passed, 500, "the op matrix should run almost entirely")
	t.Log(rep.Summary())
}

// GPUs run the work-group kernels (local-memory MATMUL tiles, attention per work-group); PoCL,
// a CPU device, takes the independent-item ones by default, so the GPU family is put through
// the suite explicitly.
func TestConformanceGPUKernels(t *testing.T) {
	b := withContextOptions{openBackend(t), map[string]string{"kernels": "gpu"}}
	rep, err := conformance.Run(context.Background(), b,
		conformance.WithFilter(regexp.MustCompile(`^(MATMUL|ATTENTION|GRAPH)`)))
	require.NoError(t, err)
	for _, c := range rep.Cases {
		if c.Status == conformance.StatusFail {
			t.Errorf("%s: %s %v", c.Name, c.Category, c.Errors)
		}
	}
	assert.Zero(t, rep.Failed)
	assert.Greater(t, rep.Passed, 20)
	t.Log(rep.Summary())
	// the option does reach the plugin: a family it does not know is refused
	_, err = withContextOptions{b.Backend, map[string]string{"kernels": "tpu"}}.Devices()[0].NewContext(context.Background(), nil)
	require.Error(t, err)
}

// Intermediate values share scratch memory once their last reader ran: values read much later
// (skip connections) must survive the values made and freed in between.
func TestScratchReuse(t *testing.T) {
	ctx := context.Background()
	cc := newContext(t, openBackend(t))
	g := core.NewGraph()
	x := g.Input("x", core.F32, 3, 70)
	a := g.SiLU(x)
	h := a
	for i := 0; i < 6; i++ { // short-lived values, freed and reused while a stays alive
		h = g.Scale(g.Exp(g.Scale(h, 0.5, 0)), 0.5, float32(i))
	}
	s := g.Add(a, h)
	g.Output(g.Mul(g.RMSNorm(s, 1e-5), a))
	rng := rand.New(rand.NewPCG(5, 6))
	ins := [][]byte{randF32(rng, 3*70)}
	want, err := ref.Run(ctx, g, ins)
	require.NoError(t, err)
	got, err := runGraph(ctx, cc, g, ins, 3*70*4)
	require.NoError(t, err)
	assert.InDeltaSlice(t, toF64(core.DecodeF32(want[0])), toF64(core.DecodeF32(got)), 1e-4)
}

func toF64(xs []float32) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

func TestContextOptions(t *testing.T) {
	b := openBackend(t)
	tests := []struct {
		opts map[string]string
		ok   bool
	}{
		{nil, true},
		{map[string]string{"kernels": "gpu"}, true},
		{map[string]string{"kernels": "cpu"}, true},
		{map[string]string{"kernels": "fastest"}, false},
		{map[string]string{"unknown": "x"}, false}, // a typo is refused, not ignored
		{map[string]string{"threads": "2"}, true},  // the host's hint to every unit
		{map[string]string{"kernels": "cpu", "threads": "1"}, true},
	}
	for _, tc := range tests {
		cc, err := b.Devices()[0].NewContext(context.Background(), tc.opts)
		if !tc.ok {
			assert.ErrorIs(t, err, core.ErrInvalidArgument, "%v", tc.opts)
			continue
		}
		require.NoError(t, err, "%v", tc.opts)
		require.NoError(t, checkMatMul(context.Background(), cc, 9, 13, 21))
		require.NoError(t, cc.Close())
	}
}

func TestImportFDErrors(t *testing.T) {
	b := openBackend(t)
	d := b.Devices()[0]
	if !d.Info().Caps.Has(core.CapImportFD) {
		t.Skip("the device does not import fds")
	}
	cc, err := d.NewContext(context.Background(), nil)
	require.NoError(t, err)
	defer cc.Close()
	f, err := os.CreateTemp(t.TempDir(), "small")
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(4096))
	tests := []struct {
		name         string
		fd           int
		offset, size int64
	}{
		{"negative fd", -1, 0, 64},
		{"not an fd", 1 << 20, 0, 64},
		{"size 0", int(f.Fd()), 0, 0},
	}
	for _, tc := range tests {
		_, err := cc.ImportFD(tc.fd, tc.offset, tc.size)
		assert.ErrorIs(t, err, core.ErrInvalidArgument, tc.name)
	}
	buf, err := cc.ImportFD(int(f.Fd()), 100, 64) // an offset inside a page
	require.NoError(t, err)
	require.NoError(t, buf.Write(0, []byte("xpu")))
	require.NoError(t, buf.Close())
	got := make([]byte, 3)
	_, err = f.ReadAt(got, 100)
	require.NoError(t, err)
	assert.Equal(t, "xpu", string(got), "the import shares the file's bytes")
}

func TestDeviceInfo(t *testing.T) {
	b := openBackend(t)
	require.NotEmpty(t, b.Devices())
	for _, d := range b.Devices() {
		in := d.Info()
		assert.NotEmpty(t, in.Name)
		assert.True(t, in.Caps.Has(core.CapAsync|core.CapHostVisible|core.CapConcurrent), "caps %s", in.Caps)
		assert.False(t, in.Caps.Has(core.CapSerialize), "serialize is not implemented")
		if in.Caps.Has(core.CapImportHost) || in.Caps.Has(core.CapImportFD) {
			assert.True(t, in.Caps.Has(core.CapUnifiedMemory), "zero-copy import needs shared memory")
		}
		// declared from the device query (ABI 1.1): every OpenCL device has compute units and a clock
		assert.Positive(t, in.Peaks.FLOPSF32, "declared f32 peak")
		assert.Equal(t, in.Caps.Has(core.CapFP16), in.Peaks.FLOPSF16 > 0, "an f16 peak exactly where fp16 is native")
		assert.Zero(t, in.Peaks.ReadBytesPerSec, "OpenCL's query has no bandwidth")
	}
	assert.Equal(t, "opencl", b.Info().Name)
}

// ---------------------------------------------------------------- separate processes

func runChild(t *testing.T, mode string, env ...string) (stdout, stderr string) {
	t.Helper()
	// a deadline, so that a child blocked for good (on a FIFO in its cache, say) fails the test
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+mode, "XPU_OPENCL_TEST_PLUGIN="+pluginPath(t)), env...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	require.NoError(t, cmd.Run(), "child %s: %s", mode, se.String())
	return so.String(), se.String()
}

func childProbe() int {
	pr, err := abi.Probe(os.Getenv("XPU_OPENCL_TEST_PLUGIN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = json.NewEncoder(os.Stdout).Encode(pr)
	return 0
}

// Without a library, a platform or a device the plugin loads and probes 0 with the reason.
func TestProbeWithoutOpenCL(t *testing.T) {
	pluginPath(t)
	tests := []struct {
		name, env, reason string
	}{
		{"no library", "XPU_OPENCL_LIBRARY=/nonexistent/libOpenCL.so.1", "/nonexistent/libOpenCL.so.1"},
		{"no platform", "OCL_ICD_VENDORS=" + t.TempDir(), "no OpenCL platform"}, // ocl-icd's vendor folder
		{"no device", "POCL_DEVICES=none", "no OpenCL device"},                  // PoCL with no driver
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, _ := runChild(t, "probe", tc.env)
			var pr abi.ProbeResult
			require.NoError(t, json.Unmarshal([]byte(out), &pr))
			assert.Equal(t, "opencl", pr.Name)
			if tc.name != "no library" && pr.Score > 0 {
				t.Skipf("this ICD setup ignores %s: %s", tc.env, pr.Reason)
			}
			assert.Zero(t, pr.Score)
			assert.Contains(t, pr.Reason, tc.reason)
		})
	}
}

// startTimes is what a child reports: time to open the backend and make its first context
// (which builds or loads the program), and to run a first MATMUL.
type startTimes struct {
	OpenMS, ContextMS, FirstRunMS float64
}

// childStart opens the plugin, makes a context and checks one MATMUL against the reference.
func childStart() int {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
	ctx := context.Background()
	t0 := time.Now()
	b, err := loader.Open(ctx, os.Getenv("XPU_OPENCL_TEST_PLUGIN"), loader.WithoutEnv())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer b.Close()
	t1 := time.Now()
	cc, err := b.Devices()[0].NewContext(ctx, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cc.Close()
	t2 := time.Now()
	if err := checkMatMul(ctx, cc, 19, 23, 40); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	t3 := time.Now()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	_ = json.NewEncoder(os.Stdout).Encode(startTimes{ms(t1.Sub(t0)), ms(t2.Sub(t1)), ms(t3.Sub(t2))})
	return 0
}

func checkMatMul(ctx context.Context, cc core.Context, m, n, k int64) error {
	g := core.NewGraph()
	g.Output(g.MatMul(g.Input("a", core.F32, m, k), g.Input("b", core.F32, n, k)))
	rng := rand.New(rand.NewPCG(1, 2))
	ins := [][]byte{randF32(rng, m*k), randF32(rng, n*k)}
	want, err := ref.Run(ctx, g, ins)
	if err != nil {
		return err
	}
	got, err := runGraph(ctx, cc, g, ins, int(m*n*4))
	if err != nil {
		return err
	}
	w, o := core.DecodeF32(want[0]), core.DecodeF32(got)
	for i := range w {
		if d := w[i] - o[i]; d > 1e-4 || d < -1e-4 {
			return fmt.Errorf("matmul[%d] = %g, want %g", i, o[i], w[i])
		}
	}
	return nil
}

func randF32(rng *rand.Rand, n int64) []byte {
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = rng.Float32()*2 - 1
	}
	return core.EncodeF32(xs)
}

// runGraph runs a one-output graph once and returns the output bytes.
func runGraph(ctx context.Context, cc core.Context, g *core.Graph, ins [][]byte, outBytes int) ([]byte, error) {
	x, bufs, done, err := prepareBound(ctx, cc, g, append(ins, make([]byte, outBytes))...)
	if err != nil {
		return nil, err
	}
	defer done()
	if err := x.Run(ctx); err != nil {
		return nil, err
	}
	out := make([]byte, outBytes)
	return out, bufs[len(ins)].Read(0, out)
}

// prepareBound prepares g on cc and binds a device buffer holding each of data (the inputs, then
// the outputs) in order; done closes them all.
func prepareBound(ctx context.Context, cc core.Context, g *core.Graph, data ...[]byte) (x core.Execution, bufs []core.Buffer, done func(), err error) {
	var closers []func() error
	done = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i]()
		}
	}
	defer func() {
		if err != nil {
			done()
		}
	}()
	exe, err := cc.Prepare(ctx, g)
	if err != nil {
		return nil, nil, nil, err
	}
	closers = append(closers, exe.Close)
	if x, err = exe.NewExecution(); err != nil {
		return nil, nil, nil, err
	}
	closers = append(closers, x.Close)
	for i, d := range data {
		buf, err := cc.Alloc(int64(len(d)), core.BufferDevice)
		if err != nil {
			return nil, nil, nil, err
		}
		closers = append(closers, buf.Close)
		bufs = append(bufs, buf)
		if err := buf.Write(0, d); err != nil {
			return nil, nil, nil, err
		}
		if err := x.Bind(i, buf, 0); err != nil {
			return nil, nil, nil, err
		}
	}
	return x, bufs, done, nil
}

// newContext makes a context on be's first device, closed when tb ends.
func newContext(tb testing.TB, be core.Backend) core.Context {
	cc, err := be.Devices()[0].NewContext(context.Background(), nil)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// benchGraph binds data to g on cc (prepareBound), runs it once (a first launch may compile, as
// PoCL does) and times x.Run.
func benchGraph(b *testing.B, cc core.Context, g *core.Graph, data ...[]byte) {
	ctx := context.Background()
	x, _, done, err := prepareBound(ctx, cc, g, data...)
	require.NoError(b, err)
	defer done()
	require.NoError(b, x.Run(ctx))
	b.ResetTimer()
	for b.Loop() {
		require.NoError(b, x.Run(ctx))
	}
}

var programLog = regexp.MustCompile(`program (built|loaded from cache) in ([0-9.]+) ms`)

// startChild runs one fresh process against the cache folder dir (and pocl, PoCL's own kernel
// cache, when not ""); it returns the times, how the program came ("built" or "loaded from
// cache") and the program's build or load time.
func startChild(t *testing.T, dir, pocl string) (startTimes, string, float64) {
	env := []string{"XPU_CACHE_DIR=" + dir}
	if pocl != "" {
		env = append(env, "POCL_CACHE_DIR="+pocl)
	}
	out, logs := runChild(t, "start", env...)
	var st startTimes
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	m := programLog.FindStringSubmatch(logs)
	require.NotNil(t, m, "no program log line in %s", logs)
	ms, _ := strconv.ParseFloat(m[2], 64)
	return st, m[1], ms
}

func logStart(t *testing.T, what string, st startTimes, program float64) {
	t.Logf("%s: open %.1f ms, context %.1f ms (program %.1f ms), first matmul %.1f ms",
		what, st.OpenMS, st.ContextMS, program, st.FirstRunMS)
}

// The first start builds the program and writes the cache; the second loads it; a corrupt
// cache file is rebuilt and rewritten, never fatal; a device's older files are pruned.
func TestProgramCache(t *testing.T) {
	openBackend(t) // skips without a device
	dir := t.TempDir()
	first, how, firstMS := startChild(t, dir, "")
	assert.Equal(t, "built", how)
	files, _ := filepath.Glob(filepath.Join(dir, "opencl-*.bin"))
	require.Len(t, files, 1, "one cache file per device")
	second, how, secondMS := startChild(t, dir, "")
	assert.Equal(t, "loaded from cache", how)
	logStart(t, "empty xpu cache", first, firstMS)
	logStart(t, "xpu cache", second, secondMS)

	blob, err := os.ReadFile(files[0])
	require.NoError(t, err)
	// a file the same device left with an older plugin: removed by the next write
	base := filepath.Base(files[0])
	stale := filepath.Join(dir, base[:len("opencl-0123456789abcdef-")]+"0000000000000000.bin")
	require.NoError(t, os.WriteFile(stale, []byte("old"), 0o644))
	corrupt := []struct {
		name string
		data []byte
		fifo bool // a FIFO in the file's place: refused at once, not read (it would block)
	}{
		{"truncated", blob[:len(blob)/2], false},
		{"flipped", func() []byte {
			b := bytes.Clone(blob)
			b[len(b)-100] ^= 0xff
			return b
		}(), false},
		{"empty", nil, false},
		{"fifo", nil, true},
	}
	for _, c := range corrupt {
		t.Run(c.name, func(t *testing.T) {
			if c.fifo {
				require.NoError(t, os.Remove(files[0]))
				require.NoError(t, unix.Mkfifo(files[0], 0o644))
			} else {
				require.NoError(t, os.WriteFile(files[0], c.data, 0o644))
			}
			_, how, _ := startChild(t, dir, "")
			assert.Equal(t, "built", how)
			again, err := os.ReadFile(files[0])
			require.NoError(t, err)
			assert.True(t, bytes.HasPrefix(again, []byte("XPUCLBN1")), "the rebuilt program was written back")
		})
	}
	_, how, _ = startChild(t, dir, "")
	assert.Equal(t, "loaded from cache", how, "the rewritten file is used")
	assert.NoFileExists(t, stale, "older cache files of the device are pruned")
}

// TestColdStart measures a really cold first start: PoCL's own kernel cache is emptied too, so
// LLVM compiles every kernel (10-25 s on 2 busy cores: opt-in, XPU_OPENCL_COLD_START=1).
func TestColdStart(t *testing.T) {
	if os.Getenv("XPU_OPENCL_COLD_START") == "" {
		t.Skip("set XPU_OPENCL_COLD_START=1 to measure a start with every cache empty")
	}
	openBackend(t)
	dir, pocl := t.TempDir(), t.TempDir()
	cold, how, coldMS := startChild(t, dir, pocl)
	assert.Equal(t, "built", how)
	// PoCL compiles each kernel's work-group function on its first launch and keeps that in its
	// own cache: a fresh PoCL cache shows what the xpu cache alone saves
	ours, how, oursMS := startChild(t, dir, t.TempDir())
	assert.Equal(t, "loaded from cache", how)
	warm, how, warmMS := startChild(t, dir, pocl)
	assert.Equal(t, "loaded from cache", how)
	logStart(t, "cold start", cold, coldMS)
	logStart(t, "xpu cache only", ours, oursMS)
	logStart(t, "both caches", warm, warmMS)
}

// FuzzProgramCache feeds arbitrary cache files to the plugin's cache reader: every start must
// still make a working context (the file is rebuilt), never crash or fail. The plugin reads
// the cache when a reopened plugin (after shutdown) makes its first context.
func FuzzProgramCache(f *testing.F) {
	path := pluginPath(f)
	if pr, err := abi.Probe(path); err != nil || pr.Score <= 0 {
		f.Skip("no OpenCL device")
	}
	dir := f.TempDir()
	startOnce := func(t testing.TB) {
		p, err := abi.Open(path)
		require.NoError(t, err)
		h, st := p.ContextCreate(0, "")
		require.Equal(t, abi.StatusOK, st, p.LastError(0))
		require.Equal(t, abi.StatusOK, p.ContextRelease(h))
		require.NoError(t, p.Close())
	}
	f.Setenv("XPU_CACHE_DIR", dir)
	startOnce(f)
	files, _ := filepath.Glob(filepath.Join(dir, "opencl-*.bin"))
	require.Len(f, files, 1)
	valid, err := os.ReadFile(files[0])
	require.NoError(f, err)
	f.Add(valid)
	f.Add(valid[:40])
	f.Add([]byte("XPUCLBN1"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		require.NoError(t, os.WriteFile(files[0], data, 0o644))
		startOnce(t)
	})
}

// ---------------------------------------------------------------- benchmark

// BenchmarkGEMM reports f32 MATMUL throughput of this plugin and, when it is built, of the NEON
// plugin under the same load: go test -bench GEMM -run '^$' ./plugins/opencl
func BenchmarkGEMM(b *testing.B) {
	for _, name := range []string{"opencl", "neon"} {
		b.Run(name, func(b *testing.B) {
			be := openBenchBackend(b, name)
			benchGEMM(b, be)
		})
	}
}

func benchGEMM(b *testing.B, be core.Backend) {
	cc := newContext(b, be)
	for _, s := range []struct {
		m, n, k int64
		w       core.DType
	}{{512, 512, 512, core.F32}, {128, 2048, 2048, core.F32}, {1, 2048, 2048, core.F32},
		{1, 2048, 2048, core.Q8_0}, {1, 2048, 2048, core.Q4_0}} {
		b.Run(fmt.Sprintf("%dx%dx%d-%s", s.m, s.n, s.k, s.w), func(b *testing.B) {
			g := core.NewGraph()
			g.Output(g.MatMul(g.Input("a", core.F32, s.m, s.k), g.Input("b", s.w, s.n, s.k)))
			rng := rand.New(rand.NewPCG(3, 4))
			a, w := randF32(rng, s.m*s.k), randF32(rng, s.n*s.k)
			if s.w != core.F32 {
				var err error
				w, err = core.Quantize(s.w, core.DecodeF32(w), 0)
				require.NoError(b, err)
			}
			benchGraph(b, cc, g, a, w, make([]byte, 4*s.m*s.n))
			flops := 2 * float64(s.m*s.n*s.k) * float64(b.N)
			b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkLaunch measures the per-node cost of a chain of tiny kernels (what bounds decode of
// small models): go test -bench Launch -run '^$' ./plugins/opencl
func BenchmarkLaunch(b *testing.B) {
	cc := newContext(b, openBackend(b))
	const nodes = 64
	g := core.NewGraph()
	h := g.Input("x", core.F32, 64)
	for range nodes {
		h = g.Scale(h, 1, 1)
	}
	g.Output(h)
	benchGraph(b, cc, g, make([]byte, 256), make([]byte, 256))
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*nodes), "µs/node")
}

// BenchmarkAttention times causal grouped-query attention over a 1024-row KV cache, for one
// query (decode) and a 64-query chunk (prefill), against the neon plugin when it is built.
func BenchmarkAttention(b *testing.B) {
	for _, name := range []string{"opencl", "neon"} {
		b.Run(name, func(b *testing.B) {
			cc := newContext(b, openBenchBackend(b, name))
			const tk, hq, hkv, d = 1024, 8, 2, 64
			for _, tq := range []int64{1, 64} {
				b.Run(fmt.Sprintf("q%d-kv%d", tq, tk), func(b *testing.B) {
					g := core.NewGraph()
					g.Output(g.Attention(g.Input("q", core.F32, tq, hq, d), g.Input("k", core.F32, tk, hkv, d),
						g.Input("v", core.F32, tk, hkv, d), core.AttentionOptions{Causal: true, QOffset: tk - tq}))
					rng := rand.New(rand.NewPCG(7, 8))
					benchGraph(b, cc, g, randF32(rng, tq*hq*d), randF32(rng, tk*hkv*d), randF32(rng, tk*hkv*d),
						make([]byte, 4*tq*hq*d))
				})
			}
		})
	}
}

// BenchmarkRowOps times the row-wise ops (one reduction per row) against neon.
func BenchmarkRowOps(b *testing.B) {
	ops := []struct {
		name  string
		build func(g *core.Graph, x *core.Tensor) *core.Tensor
	}{
		{"rms_norm", func(g *core.Graph, x *core.Tensor) *core.Tensor { return g.RMSNorm(x, 1e-5) }},
		{"softmax", func(g *core.Graph, x *core.Tensor) *core.Tensor { return g.CausalSoftmax(x, 0.125, 1024-64) }},
		{"silu_mul", func(g *core.Graph, x *core.Tensor) *core.Tensor { return g.Mul(g.SiLU(x), x) }},
	}
	for _, name := range []string{"opencl", "neon"} {
		b.Run(name, func(b *testing.B) {
			cc := newContext(b, openBenchBackend(b, name))
			for _, op := range ops {
				b.Run(op.name, func(b *testing.B) {
					g := core.NewGraph()
					g.Output(op.build(g, g.Input("x", core.F32, 8, 64, 1024)))
					const n = 8 * 64 * 1024
					benchGraph(b, cc, g, randF32(rand.New(rand.NewPCG(9, 10)), n), make([]byte, 4*n))
				})
			}
		})
	}
}

// withContextOptions opens every context of its backend's devices with opts added: the suite
// opens its own contexts, without options.
type withContextOptions struct {
	core.Backend
	opts map[string]string
}

func (b withContextOptions) Devices() []core.Device {
	var out []core.Device
	for _, d := range b.Backend.Devices() {
		out = append(out, optionsDevice{d, b.opts})
	}
	return out
}

type optionsDevice struct {
	core.Device
	opts map[string]string
}

func (d optionsDevice) NewContext(ctx context.Context, options map[string]string) (core.Context, error) {
	merged := maps.Clone(d.opts)
	maps.Copy(merged, options)
	return d.Device.NewContext(ctx, merged)
}
