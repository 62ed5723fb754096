package loader

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/shmem"
	"github.com/xpuhub/xpu/loader/plugintest"
)

// TestMain lets this test binary be the plugin host of the isolated tests: the loader starts
// os.Executable() with "plugin-host <plugin>", as it starts the xpu binary in production.
func TestMain(m *testing.M) {
	// a plugin host of another wire revision, started through a wrapper script by
	// TestIsolatedProtocolMismatch: it must answer the handshake with that version
	if v, err := strconv.Atoi(os.Getenv("XPU_TEST_PROTOCOL_VERSION")); err == nil {
		handshake.ProtocolVersion = uint(v)
	}
	ServeIfPluginHost() // inspect and serve children of this test binary
	code := m.Run()
	plugintest.Cleanup()
	os.Exit(code)
}

func f32bytes(v ...float32) []byte { return core.EncodeF32(v) }

func openIso(t testing.TB, defines ...string) core.Backend {
	t.Helper()
	path := plugintest.Plugin(t, defines...)
	be, err := Open(context.Background(), path, Isolated(), WithoutEnv())
	require.NoError(t, err)
	t.Cleanup(func() { be.Close() })
	return be
}

// relu graph over n values with a constant added: out = relu(x + c)
func reluGraph(n int64, c []byte) *core.Graph {
	g := core.NewGraph()
	x := g.Input("x", core.F32, n)
	w := g.Const("c", core.F32, core.Shape{n}, c)
	g.Output(g.ReLU(g.Add(x, w)))
	return g
}

type prepared struct {
	cx      core.Context
	exe     core.Executable
	ex      core.Execution
	in, out core.Buffer
}

func prepareRelu(t testing.TB, be core.Backend, n int64) *prepared {
	t.Helper()
	ctx := context.Background()
	cx, err := be.Devices()[0].NewContext(ctx, nil)
	require.NoError(t, err)
	c := make([]float32, n)
	for i := range c {
		c[i] = float32(i%7) - 3
	}
	exe, err := cx.Prepare(ctx, reluGraph(n, f32bytes(c...)))
	require.NoError(t, err)
	in, err := cx.Alloc(4*n, core.BufferDevice)
	require.NoError(t, err)
	out, err := cx.Alloc(4*n, core.BufferHostVisible)
	require.NoError(t, err)
	ex, err := exe.NewExecution()
	require.NoError(t, err)
	require.NoError(t, ex.Bind(0, in, 0))
	require.NoError(t, ex.Bind(1, out, 0))
	p := &prepared{cx: cx, exe: exe, ex: ex, in: in, out: out}
	t.Cleanup(func() {
		for _, c := range []interface{ Close() error }{ex, exe, in, out, cx} {
			c.Close()
		}
	})
	return p
}

func TestIsolatedRunsGraph(t *testing.T) {
	for _, variant := range []struct {
		name    string
		defines []string
	}{
		{"zero-copy import", nil},
		{"staged buffers", []string{"TP_NO_IMPORT"}},
	} {
		t.Run(variant.name, func(t *testing.T) {
			be := openIso(t, variant.defines...)
			assert.True(t, be.Info().Isolated)
			assert.Equal(t, "testplugin", be.Info().Name)
			dev := be.Devices()[0]
			assert.True(t, dev.Info().Caps.Has(core.CapImportFD))
			assert.False(t, dev.Info().Caps.Has(core.CapImportHost))
			assert.Equal(t, core.VerdictMaybe, dev.OpSupport(core.OpQuery{Op: core.OpReLU, DTypeIn: core.F32, DTypeOut: core.F32}))

			p := prepareRelu(t, be, 8)
			require.NoError(t, p.in.Write(0, f32bytes(1, 1, 1, 1, 1, 1, 1, 1)))
			require.NoError(t, p.ex.Run(context.Background()))
			got := make([]byte, 32)
			require.NoError(t, p.out.Read(0, got))
			// relu(1 + (i%7 - 3))
			assert.Equal(t, f32bytes(0, 0, 0, 1, 2, 3, 4, 0), got)

			// fences through the rpc
			f, err := p.cx.NewFence(0)
			require.NoError(t, err)
			require.NoError(t, p.in.Write(0, f32bytes(5, 5, 5, 5, 5, 5, 5, 5)))
			require.NoError(t, p.ex.Submit(nil, &core.FencePoint{Fence: f, Value: 1}))
			require.NoError(t, f.Wait(context.Background(), 1))
			m, err := p.out.Map()
			require.NoError(t, err)
			assert.Equal(t, f32bytes(2, 3, 4, 5, 6, 7, 8, 2), m)
			require.NoError(t, f.Close())

			// an fd made elsewhere (a memfd) imported as the input
			fd, err := shmem.NewFD("test-input", 48, shmem.Options{})
			require.NoError(t, err)
			defer unix.Close(fd)
			_, err = unix.Pwrite(fd, append(make([]byte, 16), f32bytes(-9, 9, -9, 9, -9, 9, -9, 9)...), 0)
			require.NoError(t, err)
			imp, err := p.cx.ImportFD(fd, 16, 32)
			require.NoError(t, err)
			require.NoError(t, p.ex.Bind(0, imp, 0))
			require.NoError(t, p.ex.Run(context.Background()))
			require.NoError(t, p.out.Read(0, got))
			assert.Equal(t, f32bytes(0, 7, 0, 9, 0, 11, 0, 6), got)
			require.NoError(t, p.ex.Bind(0, p.in, 0))
			require.NoError(t, imp.Close())

			_, err = p.cx.Import(make([]byte, 16))
			assert.ErrorIs(t, err, core.ErrUnsupported)
		})
	}
}

// TestIsolatedBytesPerExecute shows that tensor bytes never cross the rpc: an execute sends and
// receives the same few bytes for 64 values and for 1 Mi values.
func TestIsolatedBytesPerExecute(t *testing.T) {
	be := openIso(t)
	perExecute := func(n int64) uint64 {
		p := prepareRelu(t, be, n)
		require.NoError(t, p.in.Write(0, make([]byte, 4*n)))
		// Without the counters (not an isolated backend) every figure would read 0 and pass.
		before, ok := Stats(be)
		require.True(t, ok, "the backend under test is not isolated")
		const runs = 5
		for range runs {
			require.NoError(t, p.ex.Run(context.Background()))
		}
		after, ok := Stats(be)
		require.True(t, ok)
		require.GreaterOrEqual(t, after.Calls-before.Calls, uint64(runs), "each execute is at least one call")
		return (after.BytesSent + after.BytesReceived - before.BytesSent - before.BytesReceived) / runs
	}
	small := perExecute(64)
	large := perExecute(1 << 20)
	t.Logf("rpc bytes per execute: %d for 256 B tensors, %d for 4 MiB tensors", small, large)
	assert.Equal(t, small, large)
	assert.Positive(t, small, "an execute sends a request and reads a reply")
	assert.Less(t, small, uint64(256))
}

// TestIsolatedManyRuns runs long enough for both processes to collect garbage many times: the
// socket pair and the shared mappings must survive it (a finalizer once closed the child's
// socket).
func TestIsolatedManyRuns(t *testing.T) {
	t.Setenv("GOGC", "1") // read by the child at its start: it collects all the time
	be := openIso(t)
	p := prepareRelu(t, be, 256)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	in := make([]byte, 4*256)
	out := make([]byte, 4*256)
	for i := range 3000 {
		binary.LittleEndian.PutUint32(in, math.Float32bits(float32(i)))
		require.NoError(t, p.in.Write(0, in))
		require.NoError(t, p.ex.Run(ctx))
		require.NoError(t, p.out.Read(0, out))
		require.Equal(t, float32(max(i-3, 0)), math.Float32frombits(binary.LittleEndian.Uint32(out)), "run %d", i)
		if i%500 == 0 {
			runtime.GC()
		}
	}
}

func TestIsolatedFaults(t *testing.T) {
	tests := []struct {
		name   string
		fault  string
		output string // in the child's last lines
	}{
		{"segfault", "TP_FAULT=1", "SIGSEGV"},
		{"abort", "TP_FAULT=2", "SIGABRT"},
		// abi's exit guard turns the plugin's exit(3) into status 70
		{"exit", "TP_FAULT=3", "exit status 70"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be := openIso(t, tt.fault)
			p := prepareRelu(t, be, 16)
			start := time.Now()
			err := p.ex.Run(context.Background())
			require.ErrorIs(t, err, core.ErrBackendCrashed)
			assert.Less(t, time.Since(start), 5*time.Second, "the call in flight fails within bounded time")
			assert.Contains(t, err.Error(), tt.output)

			start = time.Now()
			_, err = p.cx.Alloc(16, core.BufferDevice)
			assert.ErrorIs(t, err, core.ErrBackendCrashed)
			assert.ErrorIs(t, p.ex.Run(context.Background()), core.ErrBackendCrashed)
			assert.Less(t, time.Since(start), 100*time.Millisecond, "later calls fail fast")

			require.NoError(t, be.(Restarter).Restart(context.Background()))
			st, _ := Stats(be)
			assert.Equal(t, 1, st.Restarts)
			cx, err := be.Devices()[0].NewContext(context.Background(), nil)
			require.NoError(t, err, "the restarted backend works")
			buf, err := cx.Alloc(64, core.BufferDevice)
			require.NoError(t, err)
			require.NoError(t, buf.Close())
			require.NoError(t, cx.Close())
		})
	}
}

func TestIsolatedHangKilledByDeadline(t *testing.T) {
	be := openIso(t, "TP_FAULT=4")
	p := prepareRelu(t, be, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := p.ex.Run(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, core.ErrBackendCrashed)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.ErrorIs(t, p.ex.Run(context.Background()), core.ErrBackendCrashed, "the hung child was killed")
}

func TestIsolatedByEnvironment(t *testing.T) {
	path := plugintest.Plugin(t)
	t.Setenv(EnvIsolate, "testplugin")
	be, err := Open(context.Background(), path)
	require.NoError(t, err)
	defer be.Close()
	assert.True(t, be.Info().Isolated)
	_, ok := Stats(be)
	assert.True(t, ok)

	t.Setenv(EnvIsolate, "other")
	be2, err := Open(context.Background(), path)
	require.NoError(t, err)
	defer be2.Close()
	assert.False(t, be2.Info().Isolated)
}

func TestIsolatedHostChecksum(t *testing.T) {
	path := plugintest.Plugin(t)
	_, err := Open(context.Background(), path, Isolated(), WithoutEnv(), WithHostChecksum(make([]byte, 32)))
	require.ErrorIs(t, err, core.ErrIncompatible)
	assert.Contains(t, err.Error(), "checksum")
}

func TestRPCCodecRoundTrip(t *testing.T) {
	var c rpcCodec
	req := &rpcReq{Op: opPrepare, U: [6]uint64{1, 2, 3, math.MaxUint64, 5, 6}, S: "a=1", B: []byte{1, 2, 3},
		C: []byte{}, F: []abi.FencePoint{{Fence: 7, Value: 8}}}
	b, err := c.Marshal(req)
	require.NoError(t, err)
	var got rpcReq
	require.NoError(t, c.Unmarshal(b, &got))
	assert.Equal(t, req.U, got.U)
	assert.Equal(t, req.S, got.S)
	assert.Equal(t, req.B, got.B)
	assert.Equal(t, req.F, got.F)
	resp := &rpcResp{Status: -3, U: [2]uint64{9, 10}, S: "bad handle", B: []byte("x")}
	b, err = c.Marshal(resp)
	require.NoError(t, err)
	var gr rpcResp
	require.NoError(t, c.Unmarshal(b, &gr))
	assert.Equal(t, *resp, gr)
	assert.Error(t, c.Unmarshal(b[:len(b)-1], &gr))
	assert.Error(t, c.Unmarshal(append(b, 0), &gr))
	_, err = c.Marshal("not a message")
	assert.Error(t, err)
}

func FuzzRPCUnmarshal(f *testing.F) {
	var c rpcCodec
	b, _ := c.Marshal(&rpcReq{Op: 1, S: "x", F: []abi.FencePoint{{Fence: 1, Value: 2}}})
	f.Add(b)
	b, _ = c.Marshal(&rpcResp{Status: -1, S: "y"})
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		var q rpcReq
		if c.Unmarshal(data, &q) == nil {
			again, err := c.Marshal(&q)
			require.NoError(t, err)
			require.True(t, bytes.Equal(again, data), "a decoded request encodes back to the same bytes")
		}
		var r rpcResp
		_ = c.Unmarshal(data, &r)
	})
}

// cpuTime sums user+system time of the processes from /proc/<pid>/stat (clock ticks of 10 ms).
func cpuTime(tb testing.TB, pids []int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		require.NoError(tb, err)
		// fields after the command name (which is in parentheses and may hold spaces)
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		utime, err1 := strconv.ParseInt(f[11], 10, 64)
		stime, err2 := strconv.ParseInt(f[12], 10, 64)
		require.NoError(tb, err1)
		require.NoError(tb, err2)
		total += time.Duration(utime+stime) * 10 * time.Millisecond
	}
	return total
}

func TestRingLog(t *testing.T) {
	r := &ringLog{name: "t"}
	fmt.Fprint(r, "plugin said hello\nSIGSEGV: segmentation violation\nPC=0x7f m=5 sigcode=1 addr=0x10\n")
	fmt.Fprint(r, "goroutine 23 gp=0x1 m=5 [syscall]:\nruntime.cgocall(0x1, 0x2)\n\t/go/src/runtime/cgocall.go:167 +0x4b\n")
	fmt.Fprint(r, "rax    0x0\nrip    0x7f9891a08dbb\n")
	assert.Equal(t, "plugin said hello\nSIGSEGV: segmentation violation\nPC=0x7f m=5 sigcode=1 addr=0x10", r.last())
	for i := range 30 {
		fmt.Fprintf(r, "line %d\n", i)
	}
	fmt.Fprint(r, "partial")
	last := r.last()
	assert.NotContains(t, last, "line 9\n")
	assert.Contains(t, last, "line 29\npartial")
	assert.Equal(t, "(no output)", (&ringLog{}).last())
}

// BenchmarkExecute measures the per-execute cost of the same small graph in process and
// isolated, without and with the validation layer; the differences are the isolation's and
// the validation layer's overheads.
func BenchmarkExecute(b *testing.B) {
	path := plugintest.Plugin(b)
	for _, mode := range []struct {
		name string
		opts []Option
	}{
		{"inprocess", []Option{WithoutEnv()}},
		{"isolated", []Option{WithoutEnv(), Isolated()}},
		// the validation layer's cost when it is on (off, it is not installed at all)
		{"inprocess-validate", []Option{WithoutEnv(), WithValidation()}},
		{"isolated-validate", []Option{WithoutEnv(), Isolated(), WithValidation()}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			be, err := Open(context.Background(), path, mode.opts...)
			require.NoError(b, err)
			defer be.Close()
			p := prepareRelu(b, be, 64)
			ctx := context.Background()
			pids := []int{os.Getpid()}
			if st, ok := Stats(be); ok {
				pids = append(pids, st.PID)
			}
			cpu0 := cpuTime(b, pids)
			b.ResetTimer()
			for range b.N {
				if err := p.ex.Run(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			// CPU time of both processes per execute: unlike wall time it hardly depends on
			// what else the machine runs
			b.ReportMetric(float64((cpuTime(b, pids)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// TestIsolatedOpNumbers pins the operation numbers: they are wire format shared with plugin
// hosts of other builds, so changing one breaks them (bump wireRevision and update this table
// only together).
func TestIsolatedOpNumbers(t *testing.T) {
	want := []struct {
		name string
		op   uint32
		num  uint32
	}{
		{"info", opInfo, 1}, {"op_support", opOpSupport, 2}, {"context_create", opContextCreate, 3},
		{"context_release", opContextRelease, 4}, {"buffer_alloc", opBufferAlloc, 5},
		{"buffer_import_fd", opBufferImportFD, 6}, {"buffer_release", opBufferRelease, 7},
		{"graph_analyze", opAnalyze, 8}, {"graph_prepare", opPrepare, 9},
		{"executable_serialize", opSerialize, 10}, {"executable_release", opExecutableRelease, 11},
		{"execution_create", opExecutionCreate, 12}, {"execution_bind", opExecutionBind, 13},
		{"execution_submit", opExecutionSubmit, 14}, {"execution_run", opExecutionRun, 15},
		{"execution_release", opExecutionRelease, 16}, {"fence_create", opFenceCreate, 17},
		{"fence_wait", opFenceWait, 18}, {"fence_value", opFenceValue, 19},
		{"fence_signal", opFenceSignal, 20}, {"fence_release", opFenceRelease, 21},
		{"shutdown", opShutdown, 22}, {"ring_attach", opRingAttach, 23},
	}
	for _, w := range want {
		assert.Equal(t, w.num, w.op, w.name)
	}
	assert.Equal(t, uint(abi.ABIMajor*1000+wireRevision), handshake.ProtocolVersion)
}

// TestIsolatedProtocolMismatch starts a plugin host that speaks another protocol version (as an
// older xpu named by XPU_PLUGIN_HOST would): the start is refused with ErrIncompatible and a
// message that names both versions and the remedy, before any call can be misread.
func TestIsolatedProtocolMismatch(t *testing.T) {
	path := plugintest.Plugin(t)
	self, err := os.Executable()
	require.NoError(t, err)
	for _, v := range []uint{abi.ABIMajor, protocolVersion + 1} {
		t.Run(strconv.Itoa(int(v)), func(t *testing.T) {
			host := filepath.Join(t.TempDir(), "old-xpu")
			script := fmt.Sprintf("#!/bin/sh\nXPU_TEST_PROTOCOL_VERSION=%d exec %q \"$@\"\n", v, self)
			require.NoError(t, os.WriteFile(host, []byte(script), 0o755))
			_, err := Open(context.Background(), path, Isolated(), WithoutEnv(), WithHostBinary(host))
			require.ErrorIs(t, err, core.ErrIncompatible)
			assert.Contains(t, err.Error(), fmt.Sprintf("speaks isolation protocol %d", v))
			assert.Contains(t, err.Error(), fmt.Sprintf("this xpu speaks %d", protocolVersion))
			assert.Contains(t, err.Error(), EnvHostBinary)
		})
	}
}

// TestIsolatedOpenFailure: a plugin whose open fails in the plugin host reports the plugin's
// own reason and sentinel, not go-plugin's guess about a child that printed no handshake.
func TestIsolatedOpenFailure(t *testing.T) {
	path := plugintest.Plugin(t, "TP_OPEN_FAILS")
	start := time.Now()
	_, err := Open(context.Background(), path, Isolated(), WithoutEnv())
	require.ErrorIs(t, err, core.ErrMissingDependency)
	assert.Contains(t, err.Error(), "libfake.so.2 could not be initialised")
	assert.Contains(t, err.Error(), "isolated testplugin: the plugin host could not open the plugin")
	assert.NotContains(t, err.Error(), "architecture")
	assert.Less(t, time.Since(start), 10*time.Second)
}

// runBounded runs ex and fails the test (instead of hanging it) when Run does not return
// within limit.
func runBounded(t *testing.T, ex core.Execution, limit time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- ex.Run(context.Background()) }()
	return waitRun(t, done, limit)
}

// TestIsolatedExecuteTimeout: a plugin that sleeps forever in execution_run is killed at the
// execute deadline even when the caller's context has none; the error names the plugin, the
// call and the deadline, and the backend restarts.
func TestIsolatedExecuteTimeout(t *testing.T) {
	path := plugintest.Plugin(t, "TP_FAULT=4")
	be, err := Open(context.Background(), path, Isolated(), WithoutEnv(), WithExecuteTimeout(300*time.Millisecond))
	require.NoError(t, err)
	defer be.Close()
	p := prepareRelu(t, be, 16)
	start := time.Now()
	err = runBounded(t, p.ex, 10*time.Second)
	require.ErrorIs(t, err, core.ErrTimeout)
	require.ErrorIs(t, err, core.ErrBackendCrashed)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	t.Logf("the timed-out run: %v", err)
	for _, s := range []string{"isolated testplugin", path, "execution_run did not return within 300ms",
		"--timeout", "the plugin process was killed"} {
		assert.Contains(t, err.Error(), s)
	}

	start = time.Now()
	err = p.ex.Run(context.Background())
	require.ErrorIs(t, err, core.ErrBackendCrashed, "the hung child was killed")
	assert.ErrorIs(t, err, core.ErrTimeout, "later calls say why")
	assert.Less(t, time.Since(start), 100*time.Millisecond, "later calls fail fast")

	require.NoError(t, be.(Restarter).Restart(context.Background()))
	cx, err := be.Devices()[0].NewContext(context.Background(), nil)
	require.NoError(t, err, "the restarted backend works")
	require.NoError(t, cx.Close())
}

// TestIsolatedExecuteDeadlineLearns: without a set deadline, runs are timed so that the
// automatic deadline follows the executable's longest run.
func TestIsolatedExecuteDeadlineLearns(t *testing.T) {
	be := openIso(t)
	p := prepareRelu(t, be, 64)
	h := abi.RunHistoryOf(p.ex)
	require.NotNil(t, h)
	require.Zero(t, h.Longest())
	for range 3 {
		require.NoError(t, p.ex.Run(context.Background()))
	}
	assert.Positive(t, h.Longest())
	assert.Less(t, h.Longest(), 10*time.Second)
}

func TestExecDeadline(t *testing.T) {
	tests := []struct {
		fixed, longest, want time.Duration
	}{
		{0, 0, MinExecuteTimeout},
		{0, time.Second, MinExecuteTimeout},
		{0, 5 * time.Second, 50 * time.Second},
		{2 * time.Second, 10 * time.Second, 2 * time.Second},
		{-1, 4 * time.Second, 40 * time.Second},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, execDeadline(tt.fixed, tt.longest), "fixed %v longest %v", tt.fixed, tt.longest)
	}
	assert.Positive(t, execDeadline(0, math.MaxInt64), "no overflow")
}

// TestIsolatedRunsOnRing: an uncontended execute, and a bind (a decode loop moves its KV rows
// every step), is one request on the shared-memory run ring, never an rpc or a socket message;
// a failing call on the ring reports the plugin's status and message.
func TestIsolatedRunsOnRing(t *testing.T) {
	be := openIso(t)
	p := prepareRelu(t, be, 64)
	before, ok := Stats(be)
	require.True(t, ok)
	const steps = 20
	for range steps {
		require.NoError(t, p.ex.Bind(0, p.in, 0))
		require.NoError(t, p.ex.Run(context.Background()))
	}
	after, ok := Stats(be)
	require.True(t, ok)
	assert.Equal(t, uint64(2*steps), after.RingCalls-before.RingCalls)
	assert.Equal(t, uint64(2*steps), after.Calls-before.Calls, "no other call was made")

	// a bad handle goes on the ring and comes back as the plugin's error
	f, err := p.cx.NewFence(0)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	mid, _ := Stats(be)
	err = f.Signal(1)
	require.ErrorIs(t, err, core.ErrInvalidHandle)
	assert.Contains(t, err.Error(), "testplugin fence_signal: XPU_E_INVALID_HANDLE")
	end, _ := Stats(be)
	assert.Equal(t, uint64(1), end.RingCalls-mid.RingCalls)
}

// hungOnRing starts a run of a TP_FAULT=4 plugin (it never returns) and waits until the host
// sleeps on the ring's futex; it returns the run's result channel.
func hungOnRing(t *testing.T, be core.Backend, p *prepared) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.ex.Run(context.Background()) }()
	r := be.(*isoBackend).proc.ring
	require.Eventually(t, func() bool { return atomic.LoadUint32(r.hostWaiting) == 1 }, 5*time.Second,
		time.Millisecond, "the host never slept on the ring")
	return done
}

// waitRun returns the error of a run that reports on done, failing the test when none comes
// within limit.
func waitRun(t *testing.T, done <-chan error, limit time.Duration) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Fatalf("the run did not return within %v", limit)
		return nil
	}
}

// TestIsolatedChildKilledWhileHostSleeps: a child that dies while the host sleeps on the ring's
// futex (here SIGKILLed from outside) fails the run at once, long before any deadline.
func TestIsolatedChildKilledWhileHostSleeps(t *testing.T) {
	be := openIso(t, "TP_FAULT=4")
	p := prepareRelu(t, be, 16)
	done := hungOnRing(t, be, p)
	st, _ := Stats(be)
	require.NoError(t, unix.Kill(st.PID, unix.SIGKILL))
	err := waitRun(t, done, 2*time.Second)
	require.ErrorIs(t, err, core.ErrBackendCrashed)
	assert.Contains(t, err.Error(), "signal: killed")
}

// TestIsolatedRestartWakesSleepingRun: restarting the backend from another goroutine wakes a
// run asleep on the ring (it fails with ErrBackendCrashed) instead of leaving it to its
// deadline.
func TestIsolatedRestartWakesSleepingRun(t *testing.T) {
	be := openIso(t, "TP_FAULT=4")
	p := prepareRelu(t, be, 16)
	done := hungOnRing(t, be, p)
	restarted := make(chan error, 1)
	go func() { restarted <- be.(Restarter).Restart(context.Background()) }()
	err := waitRun(t, done, 2*time.Second)
	require.ErrorIs(t, err, core.ErrBackendCrashed)
	assert.Contains(t, err.Error(), "restarted")
	require.NoError(t, <-restarted)
}

// TestIsolatedConcurrentRuns: executions run from several goroutines at once share the ring
// (one call at a time) and gRPC (the others) and each gets its own right answer.
func TestIsolatedConcurrentRuns(t *testing.T) {
	be := openIso(t)
	const workers, runs = 4, 50
	ps := make([]*prepared, workers)
	for w := range ps {
		ps[w] = prepareRelu(t, be, 8)
	}
	errs := make(chan error, workers)
	for w, p := range ps {
		go func() {
			errs <- func() error {
				got := make([]byte, 32)
				for i := range runs {
					v := float32(w*1000 + i)
					if err := p.in.Write(0, f32bytes(v, v, v, v, v, v, v, v)); err != nil {
						return err
					}
					if err := p.ex.Run(context.Background()); err != nil {
						return err
					}
					if err := p.out.Read(0, got); err != nil {
						return err
					}
					// relu(v + (i%7 - 3)) at index 0
					want := max(v-3, 0)
					if g := math.Float32frombits(binary.LittleEndian.Uint32(got)); g != want {
						return fmt.Errorf("worker %d run %d: got %v, want %v", w, i, g, want)
					}
				}
				return nil
			}()
		}()
	}
	for range workers {
		require.NoError(t, <-errs)
	}
}

// TestIsolatedHangKilledByCancel: a context cancelled (no deadline) while the host sleeps on
// the ring ends a hung run promptly; the child is killed.
func TestIsolatedHangKilledByCancel(t *testing.T) {
	be := openIso(t, "TP_FAULT=4")
	p := prepareRelu(t, be, 16)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	done := make(chan error, 1)
	go func() { done <- p.ex.Run(ctx) }()
	err := waitRun(t, done, 2*time.Second)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, core.ErrBackendCrashed)
	assert.ErrorIs(t, p.ex.Run(context.Background()), core.ErrBackendCrashed, "the hung child was killed")
}

// TestRingServesRequestPostedBeforeItStarts: the child answers ring_attach before its serving
// goroutine runs, so the host may post its first call before that goroutine looks at the
// ring. The call must still be served (it was not: the goroutine took the host's request
// for the one before and waited for another, and the host waited forever).
func TestRingServesRequestPostedBeforeItStarts(t *testing.T) {
	r, err := newRing()
	require.NoError(t, err)
	// no r.mem.close(): the serving goroutine lives on, as in the child, for the process's life
	s := &hostServer{openErr: fmt.Errorf("no plugin here")}
	last := atomic.LoadUint32(r.reqSeq) // what attachRing hands the goroutine, before answering
	r.post(last+1, &rpcReq{Op: opFenceRelease, U: [6]uint64{7}})
	go s.serveRing(r, last)
	deadline := time.Now().Add(10 * time.Second)
	for atomic.LoadUint32(r.respSeq) != last+1 {
		require.True(t, time.Now().Before(deadline), "the request posted before the server started was never answered")
		time.Sleep(time.Millisecond)
	}
	st, _, msg := r.result()
	assert.NotZero(t, st)
	assert.Contains(t, msg, "no plugin here")
}
