package abi

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/loader/plugintest"
)

func openTestPlugin(t *testing.T, defines ...string) *Plugin {
	t.Helper()
	p, err := Open(plugintest.Plugin(t, defines...))
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

func f32s(v ...float32) []byte { return core.EncodeF32(v) }

func TestProbeAndOpen(t *testing.T) {
	path := plugintest.Plugin(t)
	res, err := Probe(path)
	require.NoError(t, err)
	assert.Equal(t, "testplugin", res.Name)
	assert.Equal(t, 10, res.Score)
	assert.Equal(t, uint32(ABIMajor), res.ABIMajor)

	p, err := Open(path)
	require.NoError(t, err)
	info := p.Info()
	assert.Equal(t, "testplugin", info.Name)
	assert.Equal(t, "xpu tests", info.Vendor)
	assert.Equal(t, len(entryNames), info.TableEntries)
	// a second Open shares the plugin; shutdown happens with the last Close
	p2, err := Open(path)
	require.NoError(t, err)
	assert.Same(t, p, p2)
	require.NoError(t, p2.Close())
	n, st := p.DeviceCount()
	require.Equal(t, StatusOK, st)
	assert.Equal(t, uint32(1), n)
	require.NoError(t, p.Close())
	_, st = p.DeviceCount()
	assert.Equal(t, StatusBadState, st, "a shut-down plugin's table is not called")

	// the library stays loaded and can be opened again
	p3, err := Open(path)
	require.NoError(t, err)
	assert.NotSame(t, p, p3)
	require.NoError(t, p3.Close())
}

func TestRawAPIMisuse(t *testing.T) {
	p := openTestPlugin(t)
	ctx, st := p.ContextCreate(0, "threads=1")
	require.Equal(t, StatusOK, st)
	buf, st := p.BufferAlloc(ctx, 16, 0)
	require.Equal(t, StatusOK, st)

	tests := []struct {
		name string
		st   Status
		want Status
	}{
		{"unknown device", func() Status { _, s := p.ContextCreate(7, ""); return s }(), StatusInvalidArg},
		{"stale handle", p.BufferRelease(buf ^ 0xFF00000000), StatusInvalidHandle},
		{"write past end", p.BufferWrite(buf, 12, make([]byte, 8)), StatusInvalidArg},
		{"read past end", p.BufferRead(buf, 17, make([]byte, 1)), StatusInvalidArg},
		{"release ctx with children", p.ContextRelease(ctx), StatusBadState},
		{"serialize unsupported", func() Status { _, s := p.ExecutableSerialize(1); return s }(), StatusInvalidHandle},
		{"zero handle", p.FenceRelease(0), StatusInvalidHandle},
		// the entries called by address (callDirect) answer as the others do
		{"bind a stale execution", p.ExecutionBind(0xdead, 0, buf, 0), StatusInvalidHandle},
		{"run a stale execution", p.ExecutionRun(0xdead), StatusInvalidHandle},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.want, tt.st) })
	}
	assert.Contains(t, p.LastError(buf), "outside 16 bytes")
	require.Equal(t, StatusOK, p.BufferRelease(buf))
	assert.Equal(t, StatusInvalidHandle, p.BufferRelease(buf), "double release")
	require.Equal(t, StatusOK, p.ContextRelease(ctx))
}

func TestCallWithNullOutputs(t *testing.T) {
	p := openTestPlugin(t)
	res := p.CallWithNullOutputs()
	// every entry with a pointer argument was reached: the setup (context, buffer, prepare of
	// a RELU graph, execution) worked on the test plugin
	for _, key := range []string{"get_info", "device_count", "device_info", "op_support.query",
		"op_support.verdict", "context_create", "buffer_alloc", "buffer_import.desc", "buffer_map",
		"buffer_size", "buffer_write.src", "buffer_read.dst", "graph_analyze.ir",
		"graph_analyze.out", "graph_prepare.desc", "graph_prepare.out", "graph_prepare.ir",
		"execution_create", "execution_submit.waits", "fence_create", "fence_value",
		"last_error.buf"} {
		st, ok := res[key]
		if assert.True(t, ok, key) {
			assert.Equal(t, StatusInvalidArg, st, key)
		}
	}
	assert.Equal(t, StatusUnsupported, res["executable_serialize"])
	// everything it made was released again: shutdown finds no live object
	assert.Equal(t, StatusOK, p.Shutdown())
	// a shut-down table is not called again, by address either
	assert.Equal(t, StatusBadState, p.ExecutionRun(1))
	assert.Equal(t, StatusBadState, p.ExecutionBind(1, 0, 1, 0))
}

func TestShortTable(t *testing.T) {
	p := openTestPlugin(t, "TP_SHORT_TABLE")
	assert.Equal(t, 5, p.Info().TableEntries)
	assert.True(t, p.HasEntry("device_info"))
	assert.False(t, p.HasEntry("op_support"))
	_, st := p.ContextCreate(0, "")
	assert.Equal(t, StatusUnsupported, st, "an entry past struct_size is never called")
	assert.Equal(t, StatusUnsupported, p.ExecutionBind(1, 0, 1, 0), "nor one called by address")
	assert.Equal(t, StatusUnsupported, p.ExecutionRun(1))
	be, err := NewBackend(p)
	require.NoError(t, err)
	_, err = be.Devices()[0].NewContext(context.Background(), nil)
	assert.ErrorIs(t, err, core.ErrUnsupported)
}

func TestBackendRunsGraph(t *testing.T) {
	p := openTestPlugin(t)
	be, err := NewBackend(p)
	require.NoError(t, err)
	require.Len(t, be.Devices(), 1)
	dev := be.Devices()[0]
	assert.Equal(t, "testplugin:0", dev.Info().ID())
	assert.True(t, dev.Info().Caps.Has(core.CapImportHost))
	assert.Equal(t, core.VerdictMaybe, dev.OpSupport(core.OpQuery{Op: core.OpAdd, DTypeIn: core.F32, DTypeOut: core.F32}))
	assert.Equal(t, core.VerdictNo, dev.OpSupport(core.OpQuery{Op: core.OpGELU, DTypeIn: core.F32, DTypeOut: core.F32}))

	cx, err := dev.NewContext(context.Background(), map[string]string{"threads": "1"})
	require.NoError(t, err)
	weights := f32s(1, -2, 3, -4)
	build := func() *core.Graph {
		g := core.NewGraph()
		x := g.Input("x", core.F32, 4)
		w := g.Const("w", core.F32, core.Shape{4}, weights)
		g.Output(g.Rename(g.ReLU(g.Scale(g.Add(x, w), 2, 0.5)), "act"))
		require.NoError(t, g.Err())
		return g
	}
	exe, err := cx.Prepare(context.Background(), build())
	require.NoError(t, err)
	exe2, err := cx.Prepare(context.Background(), build())
	require.NoError(t, err)
	dc := cx.(*devContext)
	assert.Len(t, dc.consts, 1, "two graphs over the same weight slice share one device copy")
	require.Len(t, exe.Verdicts(), 3)
	assert.True(t, exe.Verdicts()[0].Supported)

	in, err := cx.Alloc(16, core.BufferDevice)
	require.NoError(t, err)
	outMem := make([]byte, 24)
	out, err := cx.Import(outMem)
	require.NoError(t, err)
	require.NoError(t, in.Write(0, f32s(1, 1, 1, 1)))
	ex, err := exe.NewExecution()
	require.NoError(t, err)
	require.NoError(t, ex.Bind(0, in, 0))
	require.NoError(t, ex.Bind(1, out, 8))
	require.NoError(t, ex.Run(context.Background()))
	// relu(2*(x+w)+0.5) at offset 8 of imported memory: written by the plugin in place
	assert.Equal(t, f32s(4.5, 0, 8.5, 0), outMem[8:])
	got := make([]byte, 16)
	require.NoError(t, out.Read(8, got))
	assert.Equal(t, outMem[8:], got)

	// binding errors are caught before the plugin is called, naming the tensor
	err = ex.Bind(1, out, 12)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "act")
	assert.ErrorIs(t, ex.Bind(2, out, 0), core.ErrInvalidArgument)

	// fences: submit signals, wait returns
	f, err := cx.NewFence(0)
	require.NoError(t, err)
	require.NoError(t, ex.Submit(nil, &core.FencePoint{Fence: f, Value: 3}))
	require.NoError(t, f.Wait(context.Background(), 3))
	v, err := f.Value()
	require.NoError(t, err)
	assert.Equal(t, uint64(3), v)
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, f.Wait(wctx, 4), context.DeadlineExceeded)

	assert.ErrorIs(t, cx.Close(), core.ErrBadState, "children alive")
	// a bound buffer may be released while its execution is idle (BAD_STATE is for an
	// execution in flight); the execution then fails until rebound
	require.NoError(t, in.Close())
	assert.Error(t, ex.Run(context.Background()), "runs on a released buffer")
	for _, c := range []interface{ Close() error }{ex, exe, exe2, out, f} {
		require.NoError(t, c.Close())
	}
	require.NoError(t, cx.Close())
	require.NoError(t, be.Close())
}

func TestPrepareNamesRefusedNode(t *testing.T) {
	p := openTestPlugin(t)
	be, err := NewBackend(p)
	require.NoError(t, err)
	cx, err := be.Devices()[0].NewContext(context.Background(), nil)
	require.NoError(t, err)
	defer cx.Close()
	g := core.NewGraph()
	x := g.Input("x", core.F32, 2, 4)
	g.Output(g.Rename(g.GELU(g.ReLU(x)), "ffn_act"))
	require.NoError(t, g.Err())
	_, err = cx.Prepare(context.Background(), g)
	require.ErrorIs(t, err, core.ErrUnsupported)
	assert.Contains(t, err.Error(), `"ffn_act"`)
	assert.Contains(t, err.Error(), "not implemented by the test plugin")

	vs, err := cx.Analyze(context.Background(), g)
	require.NoError(t, err)
	assert.True(t, vs[0].Supported)
	assert.False(t, vs[1].Supported)
	assert.Equal(t, `plugin said node 1 "ffn_act" failed`, NameNodes(g, "plugin said node 1 failed"))
	assert.Equal(t, "node 9 is not in the graph", NameNodes(g, "node 9 is not in the graph"))
}

// negOn is a context of the test plugin built with defines, a NEG of 4 floats prepared on it
// and an execution of that with nothing bound.
func negOn(t *testing.T, defines ...string) (core.Context, core.Executable, core.Execution) {
	t.Helper()
	be, err := NewBackend(openTestPlugin(t, defines...))
	require.NoError(t, err)
	cx, err := be.Devices()[0].NewContext(context.Background(), nil)
	require.NoError(t, err)
	g := core.NewGraph()
	g.Output(g.Neg(g.Input("x", core.F32, 4)))
	exe, err := cx.Prepare(context.Background(), g)
	require.NoError(t, err)
	ex, err := exe.NewExecution()
	require.NoError(t, err)
	return cx, exe, ex
}

func TestRunHonoursContext(t *testing.T) {
	cx, _, ex := negOn(t, "TP_FAULT=4", `TP_NAME="hangs"`)
	buf, err := cx.Alloc(16, core.BufferHostVisible)
	require.NoError(t, err)
	require.NoError(t, ex.Bind(0, buf, 0))
	require.NoError(t, ex.Bind(1, buf, 0))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = ex.Run(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 2*time.Second)
	// the hung call keeps its execution: nothing here may be released (the thread stays blocked)

	// a later call waits for it, but not forever, even with a context that never ends
	defer func(w time.Duration) { orphanWait = w }(orphanWait)
	orphanWait = 100 * time.Millisecond
	assert.ErrorIs(t, ex.Run(context.Background()), core.ErrBadState)
	assert.ErrorIs(t, ex.Bind(0, buf, 0), core.ErrBadState)
}

func TestOpenOptionsRejected(t *testing.T) {
	tests := []struct {
		opts map[string]string
		want string
		err  error
	}{
		{nil, "", nil},
		{map[string]string{"b": "2", "a": "1"}, "a=1;b=2", nil},
		{map[string]string{"a;b": "1"}, "", core.ErrInvalidArgument},
		{map[string]string{"a": "1;b=2"}, "", core.ErrInvalidArgument},
		{map[string]string{"": "x"}, "", core.ErrInvalidArgument},
	}
	for _, tt := range tests {
		got, err := EncodeOptions(tt.opts)
		if tt.err != nil {
			assert.ErrorIs(t, err, tt.err)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, tt.want, got)
	}
}

func TestStatus(t *testing.T) {
	tests := []struct {
		st   Status
		name string
		err  error
	}{
		{StatusUnsupported, "XPU_E_UNSUPPORTED", core.ErrUnsupported},
		{StatusInvalidArg, "XPU_E_INVALID_ARG", core.ErrInvalidArgument},
		{StatusInvalidHandle, "XPU_E_INVALID_HANDLE", core.ErrInvalidHandle},
		{StatusBadState, "XPU_E_BAD_STATE", core.ErrBadState},
		{StatusOutOfMemory, "XPU_E_OUT_OF_MEMORY", core.ErrOutOfMemory},
		{StatusIncompatible, "XPU_E_INCOMPATIBLE", core.ErrIncompatible},
		{StatusMissingDep, "XPU_E_MISSING_DEP", core.ErrMissingDependency},
		{StatusDeviceLost, "XPU_E_DEVICE_LOST", core.ErrDeviceLost},
		{StatusTimeout, "XPU_E_TIMEOUT", core.ErrTimeout},
		{StatusInternal, "XPU_E_INTERNAL", core.ErrInternal},
		{Status(-99), "XPU_E_UNKNOWN(-99)", core.ErrInternal},
		{Status(5), "XPU_E_UNKNOWN(5)", core.ErrInternal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.name, tt.st.String())
			err := tt.st.Err("the reason")
			assert.ErrorIs(t, err, tt.err)
			assert.Contains(t, err.Error(), "the reason")
			var se *StatusError
			require.True(t, errors.As(err, &se))
			assert.Equal(t, tt.st, se.Status)
		})
	}
	assert.NoError(t, StatusOK.Err("ignored"))
	assert.Equal(t, "XPU_OK", StatusOK.String())
}

func TestIsFileBacked(t *testing.T) {
	heap := make([]byte, 64)
	assert.False(t, isFileBacked(heap))
	assert.False(t, isFileBacked(nil))
	maps := "00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/dbus-daemon\n" +
		"7f0000000000-7f0000100000 rw-p 00000000 00:00 0 \n" +
		"7f0000100000-7f0000200000 r--p 00000000 00:01 42 /memfd:arena (deleted)\n"
	tests := []struct {
		lo, hi uintptr
		want   bool
	}{
		{0x400000, 0x400010, true},
		{0x451ff0, 0x452000, true},
		{0x451ff0, 0x452001, false},
		{0x7f0000000000, 0x7f0000000010, false},
		{0x7f0000100000, 0x7f0000100010, false},
		{0x10, 0x20, false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, mapsContainFile(strings.NewReader(maps), tt.lo, tt.hi), "%#x-%#x", tt.lo, tt.hi)
	}
}

func FuzzMapsContainFile(f *testing.F) {
	f.Add([]byte("00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/x\n"), uint64(0x400000), uint64(16))
	f.Add([]byte("zz-yy r 0 0 0 /a\n-\n\n"), uint64(0), uint64(0))
	f.Fuzz(func(t *testing.T, maps []byte, lo, n uint64) {
		mapsContainFile(bytes.NewReader(maps), uintptr(lo), uintptr(lo+n))
	})
}

func FuzzCheckELF(f *testing.F) {
	self, err := os.ReadFile("/proc/self/exe")
	if err == nil && len(self) > 4096 {
		f.Add(self[:4096])
	}
	f.Add([]byte("\x7fELF"))
	f.Add([]byte("not a plugin"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = checkELF(bytes.NewReader(b))
	})
}

func TestCheckELF(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "libxpu-text.so")
	require.NoError(t, os.WriteFile(text, []byte("hello"), 0o644))
	_, err := Probe(text)
	assert.ErrorIs(t, err, core.ErrIncompatible)
	assert.Contains(t, err.Error(), "not a shared library")
	_, err = Probe(filepath.Join(dir, "missing.so"))
	assert.ErrorIs(t, err, core.ErrNotFound)
}

// TestLogSink checks that plugin log lines reach slog, also from a thread the plugin made
// (the test plugin logs from a fresh pthread in open).
func TestLogSink(t *testing.T) {
	var buf syncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer slog.SetDefault(old)
	p := openTestPlugin(t)
	require.NoError(t, p.Close())
	out := buf.String()
	// A plugin's info lines are host debug detail: the library logs nothing at Info.
	assert.Contains(t, out, `level=DEBUG msg="test plugin opened from`)
	assert.NotContains(t, out, "level=INFO")
	assert.Contains(t, out, `level=DEBUG msg="hello from a plugin thread" plugin=testplugin`)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestAbandonedRunIsAwaited: a run whose caller gave up (its context ended) goes on in the
// plugin; the plugin's next calls wait for it instead of finding the execution in flight
// (BAD_STATE) or running beside it over the same buffers.
func TestAbandonedRunIsAwaited(t *testing.T) {
	cx, exe, ex := negOn(t, "TP_FAULT=6", `TP_NAME="slow"`)
	in, err := cx.Alloc(16, core.BufferHostVisible)
	require.NoError(t, err)
	out, err := cx.Alloc(16, core.BufferHostVisible)
	require.NoError(t, err)
	require.NoError(t, in.Write(0, f32s(1, -2, 3, -4)))
	require.NoError(t, ex.Bind(0, in, 0))
	require.NoError(t, ex.Bind(1, out, 0))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	require.ErrorIs(t, ex.Run(ctx), context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 250*time.Millisecond, "the caller is not held")

	// a run whose context ends while it waits for the abandoned one gives up too
	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	assert.ErrorIs(t, ex.Run(short), context.DeadlineExceeded)

	// binding waits for the abandoned runs (300 ms each) instead of answering BAD_STATE
	require.NoError(t, ex.Bind(1, out, 0))
	assert.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond, "bind waited")
	require.NoError(t, in.Write(0, f32s(5, 6, -7, 8)))
	require.NoError(t, ex.Run(context.Background()))
	got := make([]byte, 16)
	require.NoError(t, out.Read(0, got))
	assert.Equal(t, f32s(-5, -6, 7, -8), got)
	for _, c := range []interface{ Close() error }{ex, exe, in, out, cx} {
		require.NoError(t, c.Close())
	}
}
