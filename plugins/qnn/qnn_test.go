package qnn_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
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
	"github.com/xpuhub/xpu/internal/shmem"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/quant"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched"
)

// childEnv makes the test binary act as a fresh process (TestMain). The plugin loads its QNN
// library once per process and the emulator reads its environment (finalize delay, finalize
// counter) in C, so tests that need another environment run in a child of their own.
const childEnv = "XPU_QNN_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "cache":
		os.Exit(inChildContext(childCache))
	case "probe":
		os.Exit(childProbe())
	case "rpcmem":
		os.Exit(inChildContext(childRPCMem))
	case "profile":
		os.Exit(childProfile())
	}
	os.Exit(m.Run())
}

func buildDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "build", "plugins")
}

// pluginPath is build/plugins/libxpu-qnn.so of this checkout (make builds it, and the emulator
// beside it in build/plugins/qnn/).
func pluginPath(tb testing.TB) string {
	p := filepath.Join(buildDir(), "libxpu-qnn.so")
	if _, err := os.Stat(p); err != nil {
		required.Skip(tb, "qnn", "%s is not built (run make plugins): %v", p, err)
	}
	if _, err := os.Stat(filepath.Join(buildDir(), "qnn", "libQnnXpuEmu.so")); err != nil {
		required.Skip(tb, "qnn", "the QNN emulator is not built (run make plugins): %v", err)
	}
	return p
}

// openBackend opens the plugin by name through the loader. Without XPU_QNN_LIBRARY or
// QNN_SDK_ROOT in the environment it runs on the emulated provider built beside it.
func openBackend(tb testing.TB) core.Backend {
	path := pluginPath(tb)
	b, err := loader.Open(context.Background(), "qnn", loader.WithPaths(path), loader.WithoutEnv())
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = b.Close() })
	require.NotEmpty(tb, b.Devices(), "the qnn plugin opened without a device")
	return b
}

func emulated(tb testing.TB, b core.Backend) {
	if !b.Devices()[0].Info().Caps.Has(core.CapEmulated) {
		tb.Skip("a real QNN library is configured: this test needs the emulated provider")
	}
}

func TestConformance(t *testing.T) {
	b := openBackend(t)
	rep, err := conformance.Run(context.Background(), b, conformance.WithPlugin(abi.PluginOf(b)))
	require.NoError(t, err)
	for _, c := range rep.Cases {
		if c.Status != conformance.StatusFail {
			continue
		}
		t.Errorf("%s: %s %v", c.Name, c.Category, c.Errors)
	}
	assert.Zero(t, rep.Failed)
	htp := b.Devices()[0].Info().Caps.Has(core.CapFP16)
	least := 300 // the HTP profile; the CPU backend takes no F16 and moves no SFIXED_POINT_8
	if !htp {
		least = 150
	}
	assert.Greater(t, rep.Passed, least, "the op matrix should mostly run on QNN")
	t.Log(rep.Summary())
}

// Everything built on the emulator must say so: the device name, the caps, the probe.
func TestEmulatedProviderIsLabelled(t *testing.T) {
	b := openBackend(t)
	emulated(t, b)
	in := b.Devices()[0].Info()
	assert.Equal(t, "qnn (emulated provider)", in.Name)
	assert.True(t, in.Caps.Has(core.CapEmulated|core.CapStaticShapes|core.CapSerialize|core.CapImportFD), "caps %s", in.Caps)
	assert.True(t, in.Caps.Has(core.CapAsync), "submissions are queued to a worker thread")
	if os.Getenv("XPU_QNN_EMU_PROFILE") == "cpu" {
		assert.Equal(t, core.DeviceCPU, in.Kind)
		assert.False(t, in.Caps.Has(core.CapFP16), "the CPU profile is FLOAT_32 only")
	} else {
		assert.Equal(t, core.DeviceNPU, in.Kind)
		assert.True(t, in.Caps.Has(core.CapFP16), "the emulator's HTP profile (the default) stores every float as half")
	}
	pr, err := abi.Probe(pluginPath(t))
	require.NoError(t, err)
	assert.Positive(t, pr.Score)
	assert.Contains(t, pr.Reason, "emulated provider")
}

// A small transformer-style graph (weights as constants, RMSNorm, projections, RoPE, causal
// GQA attention with a static offset, SiLU gating) against core/ref.
func TestBlockMatchesRef(t *testing.T) {
	for _, dt := range []core.DType{core.F32, core.F16} {
		t.Run(dt.String(), func(t *testing.T) {
			b := openBackend(t)
			if dt == core.F16 && !b.Devices()[0].Info().Caps.Has(core.CapFP16) {
				t.Skip("the QNN CPU backend has no FLOAT_16 ops")
			}
			g, inputs := blockGraph(dt)
			want, err := ref.Run(context.Background(), g, inputs)
			require.NoError(t, err)
			got := runOn(t, b, g, inputs)
			tol := 1e-9
			if b.Devices()[0].Info().Caps.Has(core.CapFP16) {
				tol = 1e-3 // the HTP's FP16 graph: the GRAPH f16 row of conformance/TOLERANCES.md
			} else if dt == core.F16 {
				tol = 1e-5
			}
			for i := range want {
				assert.Less(t, nmse(decode(dt, got[i]), decode(dt, want[i])), tol, "output %d", i)
			}
		})
	}
}

func blockGraph(dt core.DType) (*core.Graph, [][]byte) {
	const T, H, Hkv, D, E = 5, 4, 2, 8, 32
	r := rand.New(rand.NewPCG(3, 4))
	g := core.NewGraph()
	x := g.Input("x", dt, T, E)
	pos := g.Input("pos", core.I32, T)
	w := func(name string, n, k int64) *core.Tensor {
		return g.Const(name, dt, core.Shape{n, k}, encode(dt, randf(r, int(n*k), 0.2)))
	}
	h := g.RMSNorm(x, 1e-5)
	q := g.Reshape(g.MatMul(h, w("wq", H*D, E)), T, H, D)
	k := g.Reshape(g.MatMul(h, w("wk", Hkv*D, E)), T, Hkv, D)
	v := g.Reshape(g.MatMul(h, w("wv", Hkv*D, E)), T, Hkv, D)
	q = g.RoPE(q, pos, core.RoPEOptions{})
	k = g.RoPE(k, pos, core.RoPEOptions{})
	a := g.Reshape(g.Attention(q, k, v, core.AttentionOptions{Causal: true, QOffset: 0}), T, H*D)
	o := g.Add(x, g.MatMul(a, w("wo", E, H*D)))
	up := g.Mul(g.SiLU(g.MatMul(o, w("wg", 2*E, E))), g.MatMul(o, w("wu", 2*E, E)))
	g.Output(g.Add(o, g.MatMul(up, w("wd", E, 2*E))))
	ids := make([]int32, T)
	for i := range ids {
		ids[i] = int32(3 + i)
	}
	return g, [][]byte{encode(dt, randf(r, T*E, 1)), core.EncodeI32(ids)}
}

// W8A8 (mllm-NPU's pattern): activations quantized per tensor and an I8 weight. The HTP's int8
// MatMul needs a calibrated 8/16-bit output encoding the IR does not carry (its SFIXED_POINT_32
// accumulators cannot be dequantized: the HTP's Dequantize reads 8/16-bit only), so both operands
// are dequantized and multiplied at the backend's float precision, which the plugin reports.
func TestW8A8MatchesRef(t *testing.T) {
	b := openBackend(t)
	const M, K, N = 4, 64, 24
	const sa, sb = 0.02, 0.01
	r := rand.New(rand.NewPCG(5, 6))
	w := make([]byte, N*K)
	for i := range w {
		w[i] = byte(int8(r.IntN(255) - 127))
	}
	g := core.NewGraph()
	x := g.Input("x", core.F32, M, K)
	xq := g.Dequantize(g.Quantize(x, core.I8, sa), sa)
	g.Output(g.MatMulI8(xq, g.Const("w", core.I8, core.Shape{N, K}, w), sb))
	inputs := [][]byte{core.EncodeF32(randf(r, M*K, 2))}
	want, err := ref.Run(context.Background(), g, inputs)
	require.NoError(t, err)

	ctx := context.Background()
	cc := newContext(t, b)
	verdicts, err := cc.Analyze(ctx, g)
	require.NoError(t, err)
	require.Len(t, verdicts, 3)
	for _, v := range verdicts {
		assert.True(t, v.Supported, v.Reason)
	}
	htp := b.Devices()[0].Info().Caps.Has(core.CapFP16)
	wantPrec, tol := core.PrecF32, 1e-12
	if htp {
		wantPrec, tol = core.PrecF16, 5e-4 // the MATMUL f16 row of conformance/TOLERANCES.md
	}
	assert.Equal(t, core.PrecInt8, verdicts[0].Precision, "QUANTIZE is int8")
	assert.Equal(t, wantPrec, verdicts[2].Precision, "the MatMul runs at the backend's float precision")
	exe, err := cc.Prepare(ctx, g)
	require.NoError(t, err)
	defer exe.Close()
	got := execute(t, cc, exe, g, inputs)
	assert.Less(t, nmse(core.DecodeF32(got[0]), core.DecodeF32(want[0])), tol)
}

// newContext makes a context on b's first device, closed when tb ends.
func newContext(tb testing.TB, b core.Backend) core.Context {
	cc, err := b.Devices()[0].NewContext(context.Background(), nil)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// childContext opens the plugin of this build and a context on its device, for a child process
// (which has no testing.TB); done closes both.
func childContext(ctx context.Context) (b core.Backend, cc core.Context, done func(), err error) {
	b, err = loader.Open(ctx, "qnn", loader.WithPaths(filepath.Join(buildDir(), "libxpu-qnn.so")), loader.WithoutEnv())
	if err != nil {
		return nil, nil, nil, err
	}
	if cc, err = b.Devices()[0].NewContext(ctx, nil); err != nil {
		_ = b.Close()
		return nil, nil, nil, err
	}
	return b, cc, func() { _ = cc.Close(); _ = b.Close() }, nil
}

// runOn prepares g on b's device, runs it once and returns the outputs.
func runOn(tb testing.TB, b core.Backend, g *core.Graph, inputs [][]byte, opts ...core.PrepareOption) [][]byte {
	ctx := context.Background()
	cc, err := b.Devices()[0].NewContext(ctx, nil)
	require.NoError(tb, err)
	defer cc.Close()
	exe, err := cc.Prepare(ctx, g, opts...)
	require.NoError(tb, err)
	defer exe.Close()
	return execute(tb, cc, exe, g, inputs)
}

func execute(tb testing.TB, cc core.Context, exe core.Executable, g *core.Graph, inputs [][]byte) [][]byte {
	ex, err := exe.NewExecution()
	require.NoError(tb, err)
	defer ex.Close()
	var bufs []core.Buffer
	defer func() {
		for _, b := range bufs {
			_ = b.Close()
		}
	}()
	for i, in := range inputs {
		buf, err := cc.Alloc(int64(len(in)), core.BufferHostVisible)
		require.NoError(tb, err)
		bufs = append(bufs, buf)
		require.NoError(tb, buf.Write(0, in))
		require.NoError(tb, ex.Bind(i, buf, 0))
	}
	for i, o := range g.Outputs {
		buf, err := cc.Alloc(o.Bytes(), core.BufferHostVisible)
		require.NoError(tb, err)
		bufs = append(bufs, buf)
		require.NoError(tb, ex.Bind(len(inputs)+i, buf, 0))
	}
	require.NoError(tb, ex.Run(context.Background()))
	out := make([][]byte, len(g.Outputs))
	for i, o := range g.Outputs {
		out[i] = make([]byte, o.Bytes())
		require.NoError(tb, bufs[len(inputs)+i].Read(0, out[i]))
	}
	return out
}

// The context-binary cache removes the finalize on the second prepare: measured in a child
// process where the emulator's finalize takes finalizeMS and is counted in a stats file.
func TestCacheSkipsFinalize(t *testing.T) {
	b := openBackend(t)
	emulated(t, b)
	stats := filepath.Join(t.TempDir(), "finalizes")
	out, err := child(t, "cache", "XPU_QNN_EMU_STATS="+stats, "XPU_QNN_EMU_FINALIZE_MS=400")
	require.NoError(t, err, "%s", out)
	var res cacheResult
	require.NoError(t, json.Unmarshal(lastLine(out), &res), "%s", out)
	t.Logf("prepare: %v cold, %v from the cache (%d-byte blob)", res.Cold, res.Cached, res.BlobBytes)
	n, err := os.ReadFile(stats)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(string(n), "finalize "), "one finalize for two prepares: %s", n)
	assert.GreaterOrEqual(t, res.Cold, 400*time.Millisecond, "the cold prepare finalizes")
	assert.Less(t, res.Cached, 400*time.Millisecond, "the cached prepare skips the finalize")
	assert.True(t, res.Equal, "the cached executable computes the same bytes")
	assert.True(t, res.OtherWeightsRefused, "a cache made with other weights is refused")
}

type cacheResult struct {
	Cold, Cached        time.Duration
	BlobBytes           int
	Equal               bool
	OtherWeightsRefused bool
}

func childCache(ctx context.Context, cc core.Context) int {
	g, inputs := blockGraph(core.F32)
	var res cacheResult
	t0 := time.Now()
	exe, err := cc.Prepare(ctx, g)
	if err != nil {
		return childFail(err)
	}
	res.Cold = time.Since(t0)
	blob, err := exe.Serialize()
	if err != nil {
		return childFail(err)
	}
	res.BlobBytes = len(blob)
	t0 = time.Now()
	exe2, err := cc.Prepare(ctx, g, core.WithCache(blob))
	if err != nil {
		return childFail(err)
	}
	res.Cached = time.Since(t0)
	tb := &childTB{}
	a, c := execute(tb, cc, exe, g, inputs), execute(tb, cc, exe2, g, inputs)
	if tb.failed {
		return childFail(tb.err)
	}
	res.Equal = bytes.Equal(a[0], c[0])
	_ = exe.Close()
	_ = exe2.Close()
	// other weights, same structure: the key covers the constant bytes
	g2, _ := blockGraph(core.F32)
	for _, tn := range g2.Tensors {
		if tn.Kind == core.KindConst {
			tn.Data[0] ^= 0x40
			break
		}
	}
	if _, err := cc.Prepare(ctx, g2, core.WithCache(blob)); err != nil {
		res.OtherWeightsRefused = true
	}
	return childAnswer(res)
}

// Without a QNN library the plugin still loads and probes 0 with the reason.
func TestProbeWithoutLibrary(t *testing.T) {
	pluginPath(t)
	out, err := child(t, "probe", "XPU_QNN_LIBRARY=/nonexistent/libQnnHtp.so")
	require.NoError(t, err, "%s", out)
	var pr abi.ProbeResult
	require.NoError(t, json.Unmarshal(lastLine(out), &pr), "%s", out)
	assert.Equal(t, 0, pr.Score)
	assert.Equal(t, "qnn", pr.Name)
	assert.Contains(t, pr.Reason, "/nonexistent/libQnnHtp.so")
}

// A provider of another core API version is refused at probe with both versions named: the
// declarations are pinned to 2.18, and a 2.x below it lacks entries or has other layouts.
func TestProbeRefusesOtherAPIVersion(t *testing.T) {
	emulated(t, openBackend(t))
	for _, v := range []string{"2.10", "3.18"} {
		out, err := child(t, "probe", "XPU_QNN_EMU_API_VERSION="+v)
		require.NoError(t, err, "%s", out)
		var pr abi.ProbeResult
		require.NoError(t, json.Unmarshal(lastLine(out), &pr), "%s", out)
		assert.Equal(t, 0, pr.Score, v)
		assert.Contains(t, pr.Reason, "QNN core API "+v+", this plugin needs 2.18", v)
	}
	out, err := child(t, "probe", "XPU_QNN_EMU_API_VERSION=2.30")
	require.NoError(t, err, "%s", out)
	var pr abi.ProbeResult
	require.NoError(t, json.Unmarshal(lastLine(out), &pr), "%s", out)
	assert.Positive(t, pr.Score, "a later 2.x minor only appends entries: accepted")
}

func childProbe() int {
	pr, err := abi.Probe(filepath.Join(buildDir(), "libxpu-qnn.so"))
	if err != nil {
		return childFail(err)
	}
	return childAnswer(pr)
}

// inChildContext runs a child's work f with a context on the plugin's device (childContext).
func inChildContext(f func(ctx context.Context, cc core.Context) int) int {
	ctx := context.Background()
	_, cc, done, err := childContext(ctx)
	if err != nil {
		return childFail(err)
	}
	defer done()
	return f(ctx, cc)
}

// childFail is a child's error exit: the error on stderr, where the parent reads it, and code 1.
func childFail(err error) int {
	os.Stderr.WriteString(err.Error() + "\n")
	return 1
}

// childAnswer prints a child's answer as JSON on a line of its own, the last of its stdout
// (lastLine), and exits 0.
func childAnswer(v any) int {
	j, _ := json.Marshal(v)
	os.Stdout.Write(append([]byte("\n"), j...))
	return 0
}

// An input in a memfd imported by fd is read where it is: rewriting the shared pages changes
// the next result without another write or bind.
func TestImportFDShares(t *testing.T) {
	ctx := context.Background()
	cc := newContext(t, openBackend(t))
	g := core.NewGraph()
	g.Output(g.Scale(g.Input("x", core.F32, 16), 2, 0))
	exe, err := cc.Prepare(ctx, g)
	require.NoError(t, err)
	defer exe.Close()

	fd, err := shmem.NewFD("qnn-test", 64, shmem.Options{})
	require.NoError(t, err)
	defer unix.Close(fd)
	mem, err := unix.Mmap(fd, 0, 64, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	in, err := cc.ImportFD(fd, 0, 64)
	require.NoError(t, err)
	defer in.Close()
	out, err := cc.Alloc(64, core.BufferHostVisible)
	require.NoError(t, err)
	defer out.Close()
	ex, err := exe.NewExecution()
	require.NoError(t, err)
	defer ex.Close()
	require.NoError(t, ex.Bind(0, in, 0))
	require.NoError(t, ex.Bind(1, out, 0))
	res := make([]byte, 64)
	for round := 1; round <= 2; round++ {
		xs := make([]float32, 16)
		for i := range xs {
			xs[i] = float32(i * round)
		}
		copy(mem, core.EncodeF32(xs))
		require.NoError(t, ex.Run(ctx))
		require.NoError(t, out.Read(0, res))
		for i, v := range core.DecodeF32(res) {
			require.Equal(t, float32(2*i*round), v, "round %d element %d", round, i)
		}
	}
}

// On the HTP, buffers the plugin allocates are rpcmem (libcdsprpc.so, loaded at run time; a
// memfd-backed stand-in here) and are registered as the HTP's shared buffer, a byte offset per
// tensor, so the NPU reads them in place: both tensors live in one buffer, at offsets 0 and 256.
func TestRPCMemSharedBuffer(t *testing.T) {
	if !openBackend(t).Devices()[0].Info().Caps.Has(core.CapFP16) {
		t.Skip("rpcmem shared buffers are the HTP's (this is the CPU profile)")
	}
	fake := filepath.Join(buildDir(), "..", "qnn", "libcdsprpc-fake.so")
	if _, err := os.Stat(fake); err != nil {
		required.Skip(t, "qnn", "the rpcmem stand-in is not built (run make plugins): %v", err)
	}
	stats := filepath.Join(t.TempDir(), "stats")
	out, err := child(t, "rpcmem", "XPU_QNN_EMU_STATS="+stats, "XPU_QNN_RPCMEM_LIBRARY="+fake)
	require.NoError(t, err, "%s", out)
	n, err := os.ReadFile(stats)
	require.NoError(t, err)
	assert.Contains(t, string(n), "memRegister htp-shared-buffer bytes=64 offset=0")
	assert.Contains(t, string(n), "memRegister htp-shared-buffer bytes=64 offset=256")
	// the default HTP power vote: burst
	assert.Contains(t, string(n), "powerConfig dcvs_v3 dcvs=0 mode=0x10 sleep_disable=1 bus=0xa0 core=0xa0")
	assert.Contains(t, string(n), "powerConfig rpc_polling_time=9999")
}

func childRPCMem(ctx context.Context, cc core.Context) int {
	g := core.NewGraph()
	g.Output(g.Scale(g.Input("x", core.F16, 32), 2, 0))
	exe, err := cc.Prepare(ctx, g)
	if err != nil {
		return childFail(err)
	}
	defer exe.Close()
	buf, err := cc.Alloc(512, core.BufferHostVisible)
	if err != nil {
		return childFail(err)
	}
	defer buf.Close()
	ex, err := exe.NewExecution()
	if err != nil {
		return childFail(err)
	}
	defer ex.Close()
	xs := make([]float32, 32)
	for i := range xs {
		xs[i] = float32(i) - 7
	}
	if err = buf.Write(0, encode(core.F16, xs)); err == nil {
		if err = ex.Bind(0, buf, 0); err == nil {
			if err = ex.Bind(1, buf, 256); err == nil {
				err = ex.Run(ctx)
			}
		}
	}
	if err != nil {
		return childFail(err)
	}
	res := make([]byte, 64)
	if err := buf.Read(256, res); err != nil {
		return childFail(err)
	}
	for i, v := range decode(core.F16, res) {
		if v != 2*xs[i] {
			return childFail(fmt.Errorf("element %d is %g, want %g", i, v, 2*xs[i]))
		}
	}
	return 0
}

// The executable cache blob is parsed by the plugin (and its QNN binary by the provider):
// damaged blobs give an error, never a crash, and never a wrong executable.
func FuzzPrepareFromCache(f *testing.F) {
	ctx := context.Background()
	cc := newContext(f, openBackend(f))
	g := core.NewGraph()
	g.Output(g.SiLU(g.MatMul(g.Input("x", core.F32, 2, 8), g.Const("w", core.F32, core.Shape{3, 8}, core.EncodeF32(randf(rand.New(rand.NewPCG(1, 1)), 24, 1))))))
	exe, err := cc.Prepare(ctx, g)
	require.NoError(f, err)
	blob, err := exe.Serialize()
	require.NoError(f, err)
	require.NoError(f, exe.Close())
	f.Add(blob)
	f.Add(blob[:len(blob)/2])
	f.Add([]byte{})
	flipped := bytes.Clone(blob)
	flipped[len(flipped)-20] ^= 1
	f.Add(flipped)
	f.Fuzz(func(t *testing.T, data []byte) {
		exe, err := cc.Prepare(ctx, g, core.WithCache(data))
		if err != nil {
			return
		}
		defer exe.Close()
		// an empty cache means "no cache": a normal prepare
		assert.True(t, len(data) == 0 || bytes.Equal(data, blob), "only the genuine blob may load")
	})
}

// The whole LLM path on the static-shape NPU: stories260K greedy from BOS on the emulated HTP
// (FP16 graphs; the nodes the HTP refuses, such as the F32 embedding gather that must be
// bit-exact, fall back to core/ref) against core/ref in f32, step by step: the logits of every
// step within the FP16 model-level tolerance (GRAPH f16 row: NMSE 1e-3, max-abs 0.05 of the peak)
// and the same greedy token for at least 128 steps. A multi-chunk prompt (chunk-sharing graphs
// with a run-time attention offset) then continues as on core/ref.
func TestStoriesOnNPU(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "..", "shared", "models")
	if _, err := os.Stat(filepath.Join(dir, "stories260K.gguf")); err != nil {
		t.Skipf("test models absent (%s): %v", dir, err)
	}
	b := openBackend(t)
	ctx := context.Background()
	m, err := llm.Open(filepath.Join(dir, "stories260K.gguf"))
	require.NoError(t, err)
	defer m.Close()
	want, err := os.ReadFile(filepath.Join(dir, "stories260K.greedy.txt"))
	require.NoError(t, err)
	rb := ref.New()
	defer rb.Close()
	npu, cpu := b.Devices()[0], rb.Devices()[0]
	unit := func(d core.Device) string {
		in := d.Info()
		return sched.UnitSpec{Backend: in.Backend, Index: in.Index}.String()
	}
	plan := &sched.Plan{Units: []string{unit(npu), unit(cpu)},
		Prefill: sched.PhasePlan{Rules: []sched.Rule{{Unit: "0", Fallback: "1"}}}}
	newNPU := func() *llm.Runner {
		r, err := llm.NewPlannedRunner(ctx, m, []core.Device{npu, cpu}, plan, llm.WithChunkSize(8))
		require.NoError(t, err)
		return r
	}
	rn := newNPU()
	defer rn.Close()
	rr, err := llm.NewRunner(ctx, m, cpu, llm.WithChunkSize(8))
	require.NoError(t, err)
	defer rr.Close()

	argmax := func(xs []float32) int32 {
		best := 0
		for i, x := range xs {
			if x > xs[best] {
				best = i
			}
		}
		return int32(best)
	}
	bos := m.Tokenizer.BOS()
	require.GreaterOrEqual(t, bos, int32(0))
	ln, err := rn.Prefill(ctx, []int32{bos})
	require.NoError(t, err)
	lr, err := rr.Prefill(ctx, []int32{bos})
	require.NoError(t, err)
	const steps = 160
	same, worst := 0, 0.0
	var ids []int32
	for step := 0; step < steps; step++ {
		var peak, maxAbs float64
		for i := range lr {
			peak = math.Max(peak, math.Abs(float64(lr[i])))
			maxAbs = math.Max(maxAbs, math.Abs(float64(ln[i]-lr[i])))
		}
		e := nmse(ln, lr)
		worst = math.Max(worst, e)
		require.Less(t, e, 1e-3, "step %d: logits NMSE", step)
		require.LessOrEqual(t, maxAbs, 0.05*math.Max(1, peak), "step %d: logits max-abs", step)
		tn, tr := argmax(ln), argmax(lr)
		if tn != tr {
			break
		}
		same++
		ids = append(ids, tn)
		if ln, err = rn.Decode(ctx, tn); err != nil {
			break
		}
		lr, err = rr.Decode(ctx, tr)
		require.NoError(t, err)
	}
	require.NoError(t, err)
	t.Logf("stories260K on the HTP profile: %d of %d greedy tokens equal core/ref's, worst logits NMSE %.3g", same, steps, worst)
	assert.GreaterOrEqual(t, same, 128, "greedy tokens equal to core/ref")
	dec := m.Tokenizer.NewDecoder()
	var text strings.Builder
	for _, id := range ids[:min(32, len(ids))] {
		text.WriteString(dec.Next(id))
	}
	assert.True(t, strings.HasPrefix(string(want), text.String()), "greedy text on qnn: %q", text.String())

	prompt := "Once upon a time, there was a little dog named Max. He liked to run in the"
	generate := func(r *llm.Runner) string {
		res, err := r.Generate(ctx, prompt, llm.WithMaxTokens(16))
		require.NoError(t, err)
		return res.Text
	}
	assert.Equal(t, generate(rr), generate(rn))
}

// ---------------------------------------------------------------- helpers

func child(t *testing.T, mode string, env ...string) ([]byte, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	cmd.Env = append(cmd.Env, env...)
	return cmd.CombinedOutput()
}

func lastLine(b []byte) []byte {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return lines[len(lines)-1]
}

// childTB collects require failures in a child process.
type childTB struct {
	testing.TB
	failed bool
	err    error
}

func (c *childTB) Helper() {}
func (c *childTB) Errorf(format string, args ...any) {
	c.failed = true
	c.err = fmt.Errorf(format, args...)
}
func (c *childTB) FailNow() { panic(c.err) }

func randf(r *rand.Rand, n int, scale float32) []float32 {
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = (r.Float32()*2 - 1) * scale
	}
	return xs
}

func encode(dt core.DType, xs []float32) []byte {
	if dt == core.F32 {
		return core.EncodeF32(xs)
	}
	b := make([]byte, 2*len(xs))
	for i, x := range xs {
		h := core.F32ToF16(x)
		b[2*i], b[2*i+1] = byte(h), byte(h>>8)
	}
	return b
}

func decode(dt core.DType, b []byte) []float32 {
	if dt == core.F32 {
		return core.DecodeF32(b)
	}
	xs := make([]float32, len(b)/2)
	for i := range xs {
		xs[i] = core.F16ToF32(uint16(b[2*i]) | uint16(b[2*i+1])<<8)
	}
	return xs
}

// nmse is llm.NMSE with a NaN (a NaN in got) made +Inf, so that it fails a bound and can be
// written as JSON.
func nmse(got, want []float32) float64 {
	if e := quant.NMSE(got, want); !math.IsNaN(e) {
		return e
	}
	return math.Inf(1)
}
