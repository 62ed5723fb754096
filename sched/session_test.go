package sched_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

var quiet = sched.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))

// chain builds y = ((x + w)²)·0.5 + 1 with nodes "add", "mul", "scale".
func chain(t testing.TB) *core.Graph {
	g := core.NewGraph()
	x := g.Input("x", core.F32, 2, 4)
	w := g.Const("w", core.F32, core.Shape{4}, core.EncodeF32([]float32{1, 2, 3, 4}))
	a := g.Named("add").Add(x, w)
	m := g.Named("mul").Mul(a, a)
	g.Output(g.Named("scale").Scale(m, 0.5, 1))
	require.NoError(t, g.Err())
	return g
}

func chainWant(x []float32) []float32 {
	w := []float32{1, 2, 3, 4}
	out := make([]float32, len(x))
	for i, v := range x {
		a := v + w[i%4]
		out[i] = a*a*0.5 + 1
	}
	return out
}

func input(seed int) []float32 {
	x := make([]float32, 8)
	for i := range x {
		x[i] = float32(seed) + float32(i)*0.25
	}
	return x
}

func runChain(t *testing.T, s *sched.Session, seed int) {
	t.Helper()
	x := input(seed)
	out, err := s.Run(context.Background(), [][]byte{core.EncodeF32(x)})
	require.NoError(t, err)
	require.Len(t, out, 1)
	assert.InDeltaSlice(t, chainWant(x), core.DecodeF32(out[0]), 1e-5)
}

// devicesOf maps each node of the report to its device.
func devicesOf(r sched.Report) map[string]string {
	m := map[string]string{}
	for _, n := range r.Nodes {
		m[n.Node] = n.Unit
	}
	return m
}

func devs(ds ...*fakeDevice) []core.Device {
	out := make([]core.Device, len(ds))
	for i, d := range ds {
		out[i] = d
	}
	return out
}

func TestPolicyOrder(t *testing.T) {
	all := allFakeOps
	emu := newFake("qnn-emu", core.DeviceNPU, all...)
	emu.caps = core.CapEmulated
	gpuFP16 := newFake("opencl", core.DeviceGPU, all...)
	gpuFP16.caps = core.CapFP16
	tests := []struct {
		name   string
		policy sched.Policy
		devs   []*fakeDevice
		want   string // device of every node
	}{
		{"prefer-npu", sched.PreferNPU, []*fakeDevice{newFake("neon", core.DeviceCPU, all...),
			newFake("opencl", core.DeviceGPU, all...), newFake("qnn", core.DeviceNPU, all...)}, "qnn:0"},
		{"prefer-gpu", sched.PreferGPU, []*fakeDevice{newFake("qnn", core.DeviceNPU, all...),
			newFake("opencl", core.DeviceGPU, all...), newFake("neon", core.DeviceCPU, all...)}, "opencl:0"},
		{"prefer-cpu native before ref", sched.PreferCPU, []*fakeDevice{newFake("ref", core.DeviceCPU, all...),
			newFake("qnn", core.DeviceNPU, all...), newFake("neon", core.DeviceCPU, all...)}, "neon:0"},
		{"max-performance npu", sched.MaxPerformance, []*fakeDevice{newFake("neon", core.DeviceCPU, all...),
			newFake("qnn", core.DeviceNPU, all...)}, "qnn:0"},
		{"max-performance gpu over accel", sched.MaxPerformance, []*fakeDevice{newFake("coreml", core.DeviceAccel, all...),
			newFake("opencl", core.DeviceGPU, all...)}, "opencl:0"},
		{"max-efficiency accel over gpu", sched.MaxEfficiency, []*fakeDevice{newFake("opencl", core.DeviceGPU, all...),
			newFake("coreml", core.DeviceAccel, all...)}, "coreml:0"},
		{"max-performance caps break ties", sched.MaxPerformance, []*fakeDevice{newFake("vk", core.DeviceGPU, all...),
			gpuFP16}, "opencl:0"},
		{"emulator last even if npu", sched.PreferNPU, []*fakeDevice{emu, newFake("neon", core.DeviceCPU, all...)}, "neon:0"},
		{"ref last", sched.MaxPerformance, []*fakeDevice{newFake("ref", core.DeviceCPU, all...),
			newFake("neon", core.DeviceCPU, all...)}, "neon:0"},
		{"by backend name", sched.ByName("ref", "neon"), []*fakeDevice{newFake("neon", core.DeviceCPU, all...),
			newFake("ref", core.DeviceCPU, all...)}, "ref:0"},
		{"by device id", sched.ByName("opencl:0"), []*fakeDevice{newFake("qnn", core.DeviceNPU, all...),
			newFake("opencl", core.DeviceGPU, all...)}, "opencl:0"},
		{"by name skips a refusing device", sched.ByName("qnn", "opencl"), []*fakeDevice{
			newFake("qnn", core.DeviceNPU), newFake("opencl", core.DeviceGPU, all...)}, "opencl:0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := sched.NewSession(context.Background(), chain(t), devs(tt.devs...), sched.WithPolicy(tt.policy), quiet)
			require.NoError(t, err)
			defer func() { require.NoError(t, s.Close()) }()
			for node, dev := range devicesOf(s.Report()) {
				assert.Equal(t, tt.want, dev, "node %s", node)
			}
			runChain(t, s, 1)
		})
	}
}

func TestCustomPolicy(t *testing.T) {
	npu := newFake("qnn", core.DeviceNPU, allFakeOps...)
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	matmulsOnNPU := sched.PolicyFunc("mul-on-npu", func(n *core.Node, ds []core.Device) []core.Device {
		if n.Op == core.OpMul {
			return []core.Device{npu}
		}
		return []core.Device{cpu}
	})
	s, err := sched.NewSession(context.Background(), chain(t), devs(cpu, npu), sched.WithPolicy(matmulsOnNPU), quiet)
	require.NoError(t, err)
	defer s.Close()
	assert.Equal(t, map[string]string{"add": "neon:0", "mul": "qnn:0", "scale": "neon:0"}, devicesOf(s.Report()))
	r := s.Report()
	assert.Equal(t, 3, r.Partitions)
	assert.Equal(t, 2, r.CopiesPerRun, "add's result goes to the npu, mul's comes back")
	runChain(t, s, 2)
}

func TestFallbackReport(t *testing.T) {
	npu := newFake("qnn", core.DeviceNPU, core.OpMul)
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	for _, policy := range []sched.Policy{sched.PreferNPU, sched.ByName("qnn")} {
		t.Run(policy.Name(), func(t *testing.T) {
			s, err := sched.NewSession(context.Background(), chain(t), devs(npu, cpu), sched.WithPolicy(policy), quiet)
			require.NoError(t, err)
			defer s.Close()
			r := s.Report()
			assert.Equal(t, map[string]string{"add": "neon:0", "mul": "qnn:0", "scale": "neon:0"}, devicesOf(r))
			byNode := map[string]sched.NodeReport{}
			for _, n := range r.Nodes {
				byNode[n.Node] = n
			}
			assert.True(t, byNode["add"].Fallback)
			assert.Contains(t, byNode["add"].Reason, "qnn:0: ADD is not implemented")
			assert.False(t, byNode["mul"].Fallback)
			assert.Equal(t, core.PrecF32, byNode["mul"].Precision)
			assert.Equal(t, 1, byNode["mul"].CopiesIn)
			assert.Equal(t, 1, byNode["scale"].CopiesIn)
			assert.Equal(t, 2, r.CopiesPerRun)
			assert.Equal(t, int64(2*32), r.CopyBytesPerRun)

			for i := range 3 {
				runChain(t, s, i)
			}
			r = s.Report()
			assert.Equal(t, int64(3), r.Runs)
			assert.Equal(t, int64(6), r.Copies)
			assert.Equal(t, int64(6*32), r.CopyBytes)

			table := r.String()
			assert.Contains(t, table, "3 partition(s); 2 copies per run")
			lines := strings.Split(strings.TrimSpace(table), "\n")
			require.Len(t, lines, 5)
			col := strings.Index(lines[1], "UNIT")
			for _, l := range lines[2:] {
				assert.True(t, l[col-1] == ' ' && (strings.HasPrefix(l[col:], "neon:0") ||
					strings.HasPrefix(l[col:], "qnn:0")), "unit column aligned: %q", l)
			}
		})
	}
}

func TestStrict(t *testing.T) {
	npu := newFake("qnn", core.DeviceNPU, core.OpMul)
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	_, err := sched.NewSession(context.Background(), chain(t), devs(npu, cpu), sched.WithPolicy(sched.PreferNPU),
		sched.Strict(), quiet)
	require.ErrorIs(t, err, core.ErrUnsupported)
	assert.Contains(t, err.Error(), `"add"`)
	assert.Contains(t, err.Error(), "qnn:0: ADD is not implemented")
	assert.Zero(t, npu.liveContexts.Load()+cpu.liveContexts.Load(), "contexts closed after a failed NewSession")

	// Strict and satisfied: every node on its first choice.
	s, err := sched.NewSession(context.Background(), chain(t), devs(npu, cpu), sched.WithPolicy(sched.PreferCPU),
		sched.Strict(), quiet)
	require.NoError(t, err)
	assert.True(t, s.Report().Strict)
	require.NoError(t, s.Close())
}

func TestNoDeviceAccepts(t *testing.T) {
	g := core.NewGraph()
	x := g.Input("x", core.F32, 4)
	d := g.Named("double").Scale(x, 2, 0)
	g.Output(g.Named("act").SiLU(d))
	require.NoError(t, g.Err())
	npu := newFake("qnn", core.DeviceNPU, core.OpScale)
	cpu := newFake("neon", core.DeviceCPU, core.OpScale)
	_, err := sched.NewSession(context.Background(), g, devs(npu, cpu), quiet)
	require.ErrorIs(t, err, core.ErrUnsupported)
	assert.Contains(t, err.Error(), `no device accepts node 1 "act"`)
	assert.Contains(t, err.Error(), "qnn:0: SILU is not implemented")
	assert.Contains(t, err.Error(), "neon:0: SILU is not implemented")

	// Without a CPU device there is no fallback.
	_, err = sched.NewSession(context.Background(), g, devs(npu), sched.WithPolicy(sched.ByName("qnn")), quiet)
	require.ErrorIs(t, err, core.ErrUnsupported)
}

func TestAnalyzeFailureFallsBack(t *testing.T) {
	npu := newFake("qnn", core.DeviceNPU, allFakeOps...)
	npu.analyzeErr = fmt.Errorf("qnn: graph too large: %w", core.ErrUnsupported)
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	s, err := sched.NewSession(context.Background(), chain(t), devs(npu, cpu), quiet)
	require.NoError(t, err)
	defer s.Close()
	r := s.Report()
	assert.Equal(t, []string{"neon:0"}, r.Units)
	assert.Contains(t, r.Nodes[0].Reason, "graph too large")
	assert.Zero(t, npu.liveContexts.Load(), "a private executor closes unused contexts")
	runChain(t, s, 3)
}

func TestDevicesOpenInParallel(t *testing.T) {
	r := newRendezvous(2)
	npu := newFake("qnn", core.DeviceNPU, core.OpMul)
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	npu.openRendezvous, cpu.openRendezvous = r, r
	s, err := sched.NewSession(context.Background(), chain(t), devs(npu, cpu), quiet)
	require.NoError(t, err)
	require.NoError(t, s.Close())
}

func TestContextOpenFailureFallsBack(t *testing.T) {
	npu := newFake("qnn", core.DeviceNPU, allFakeOps...)
	npu.openErr = fmt.Errorf("qnn: libQnnHtp.so not found: %w", core.ErrMissingDependency)
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	e := sched.NewExecutor(quiet)
	defer func() { require.NoError(t, e.Close()) }()
	s, err := sched.NewSession(context.Background(), chain(t), devs(npu, cpu), sched.WithExecutor(e), quiet)
	require.NoError(t, err)
	assert.Equal(t, []string{"neon:0"}, s.Report().Units)
	assert.Contains(t, s.Report().Nodes[0].Reason, "libQnnHtp.so not found")
	runChain(t, s, 10)
	require.NoError(t, s.Close())

	npu.openErr = nil // a failed open is not remembered: the next session tries again
	s, err = sched.NewSession(context.Background(), chain(t), devs(npu, cpu), sched.WithExecutor(e), quiet)
	require.NoError(t, err)
	assert.Equal(t, []string{"qnn:0"}, s.Report().Units)
	require.NoError(t, s.Close())
}

func TestBadArguments(t *testing.T) {
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	ctx := context.Background()
	_, err := sched.NewSession(ctx, chain(t), nil, quiet)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	_, err = sched.NewSession(ctx, chain(t), devs(cpu, cpu), quiet)
	assert.ErrorIs(t, err, core.ErrInvalidArgument, "a device given twice")
	_, err = sched.NewSession(ctx, chain(t), devs(cpu), sched.WithPolicy(sched.ByName("qnn")), quiet)
	assert.ErrorIs(t, err, core.ErrNotFound)
	_, err = sched.NewSession(ctx, chain(t), devs(cpu), sched.WithPolicy(sched.PolicyFunc("bad",
		func(*core.Node, []core.Device) []core.Device { return []core.Device{newFake("x", core.DeviceCPU)} })), quiet)
	assert.ErrorIs(t, err, core.ErrInvalidArgument, "a policy may not invent devices")
	_, err = sched.NewSession(ctx, core.NewGraph(), devs(cpu), quiet)
	assert.ErrorIs(t, err, core.ErrGraph)
	_, err = sched.NewSession(ctx, chain(t), []core.Device{cpu, nil}, quiet)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	_, err = sched.NewSession(ctx, chain(t), devs(cpu), sched.WithPolicy(nil), quiet)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)

	s, err := sched.NewSession(ctx, chain(t), devs(cpu), quiet)
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Run(ctx, nil)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	_, err = s.Run(ctx, [][]byte{make([]byte, 31)})
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
}

func TestContextOptions(t *testing.T) {
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	s, err := sched.NewSession(context.Background(), chain(t), devs(cpu),
		sched.WithContextOptions(map[string]string{"threads": "2"}), quiet)
	require.NoError(t, err)
	defer s.Close()
	assert.Equal(t, map[string]string{"threads": "2"}, cpu.lastOptions.Load())
}

func TestConcurrentRun(t *testing.T) {
	npu := newFake("qnn", core.DeviceNPU, core.OpMul)
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	s, err := sched.NewSession(context.Background(), chain(t), devs(npu, cpu), sched.WithPolicy(sched.PreferNPU), quiet)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 10 {
				runChain(t, s, g*100+i)
			}
		})
	}
	wg.Wait()
	r := s.Report()
	assert.Equal(t, int64(80), r.Runs)
	assert.Equal(t, int64(160), r.Copies)
	assert.Equal(t, int32(1), npu.prepares.Load(), "prepared once, run many")
	require.NoError(t, s.Close())
	assert.Zero(t, npu.liveContexts.Load()+cpu.liveContexts.Load())
}

// TestDevicesOverlap runs two independent branches on two devices: each execution waits until
// the other has started, so the test only passes if the session runs them concurrently.
func TestDevicesOverlap(t *testing.T) {
	g := core.NewGraph()
	x := g.Input("x", core.F32, 4)
	a := g.Named("left").Scale(x, 2, 0)
	b := g.Named("right").SiLU(x)
	g.Output(g.Named("join").Add(a, b))
	require.NoError(t, g.Err())

	// "left" and "right" meet; "join" then finds the rendezvous complete.
	r := newRendezvous(2)
	gpu := newFake("opencl", core.DeviceGPU, core.OpScale, core.OpAdd)
	cpu := newFake("neon", core.DeviceCPU, core.OpSiLU, core.OpAdd)
	gpu.rendezvous, cpu.rendezvous = r, r
	s, err := sched.NewSession(context.Background(), g, devs(gpu, cpu), quiet)
	require.NoError(t, err)
	defer s.Close()
	assert.Equal(t, map[string]string{"left": "opencl:0", "right": "neon:0", "join": "opencl:0"}, devicesOf(s.Report()))

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	xs := []float32{-1, 0, 1, 2}
	out, err := s.Run(ctx, [][]byte{core.EncodeF32(xs)})
	require.NoError(t, err)
	got := core.DecodeF32(out[0])
	for i, v := range xs {
		silu := v / (1 + float32(math.Exp(float64(-v))))
		assert.InDelta(t, 2*v+silu, got[i], 1e-5)
	}
}

func TestCancel(t *testing.T) {
	npu := newFake("qnn", core.DeviceNPU, core.OpMul)
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	s, err := sched.NewSession(context.Background(), chain(t), devs(npu, cpu), sched.WithPolicy(sched.PreferNPU), quiet)
	require.NoError(t, err)
	defer s.Close()
	x := [][]byte{core.EncodeF32(input(0))}

	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = s.Run(done, x)
	assert.ErrorIs(t, err, context.Canceled)
	_, err = sched.NewSession(done, chain(t), devs(npu, cpu), quiet)
	assert.ErrorIs(t, err, context.Canceled, "NewSession honours ctx too")

	npu.delay = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = s.Run(ctx, x)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 10*time.Second)

	npu.delay = 0
	runChain(t, s, 4) // a cancelled Run leaves the session usable
}

func TestClose(t *testing.T) {
	npu := newFake("qnn", core.DeviceNPU, core.OpMul)
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	s, err := sched.NewSession(context.Background(), chain(t), devs(npu, cpu), sched.WithPolicy(sched.PreferNPU), quiet)
	require.NoError(t, err)
	runChain(t, s, 5)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "closing twice is a no-op")
	assert.Zero(t, npu.liveContexts.Load()+cpu.liveContexts.Load())
	_, err = s.Run(context.Background(), [][]byte{core.EncodeF32(input(0))})
	assert.ErrorIs(t, err, core.ErrBadState)
}

// TestCloseWhileRunning closes a session under concurrent Runs and Executions: each call
// either completes or reports ErrBadState, and everything is released.
func TestCloseWhileRunning(t *testing.T) {
	npu := newFake("qnn", core.DeviceNPU, core.OpMul)
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	s, err := sched.NewSession(context.Background(), chain(t), devs(npu, cpu), sched.WithPolicy(sched.PreferNPU), quiet)
	require.NoError(t, err)
	started := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			x := [][]byte{core.EncodeF32(input(1))}
			for i := 0; ; i++ {
				if i == 1 {
					started <- struct{}{}
				}
				if _, err := s.Run(context.Background(), x); err != nil {
					assert.ErrorIs(t, err, core.ErrBadState)
					return
				}
			}
		})
	}
	for range 4 {
		<-started
	}
	require.NoError(t, s.Close())
	wg.Wait()
	assert.Zero(t, npu.liveContexts.Load()+cpu.liveContexts.Load())
}

func TestExecutorShares(t *testing.T) {
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	e := sched.NewExecutor(quiet)
	g := chain(t)
	s1, err := sched.NewSession(context.Background(), g, devs(cpu), sched.WithExecutor(e), quiet)
	require.NoError(t, err)
	s2, err := sched.NewSession(context.Background(), g, devs(cpu), sched.WithExecutor(e), quiet)
	require.NoError(t, err)
	assert.Equal(t, int32(1), cpu.contexts.Load(), "one context per device")
	assert.Equal(t, int32(1), cpu.prepares.Load(), "the same graph is prepared once")
	runChain(t, s1, 6)
	runChain(t, s2, 7)

	// Same structure, other constant bytes: prepared again.
	other := core.NewGraph()
	x := other.Input("x", core.F32, 2, 4)
	w := other.Const("w", core.F32, core.Shape{4}, core.EncodeF32([]float32{1, 2, 3, 4}))
	a := other.Add(x, w)
	other.Output(other.Scale(other.Mul(a, a), 0.5, 1))
	s3, err := sched.NewSession(context.Background(), other, devs(cpu), sched.WithExecutor(e), quiet)
	require.NoError(t, err)
	assert.Equal(t, int32(2), cpu.prepares.Load())
	runChain(t, s3, 8)

	for _, s := range []*sched.Session{s1, s2, s3} {
		require.NoError(t, s.Close())
	}
	assert.Equal(t, int32(1), cpu.liveContexts.Load(), "the executor keeps its context")
	require.NoError(t, e.Close())
	assert.Zero(t, cpu.liveContexts.Load())
	_, err = sched.NewSession(context.Background(), g, devs(cpu), sched.WithExecutor(e), quiet)
	assert.ErrorIs(t, err, core.ErrBadState)
}

func TestExecutorEvicts(t *testing.T) {
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	e := sched.NewExecutor(sched.WithCacheSize(1), quiet)
	defer func() { require.NoError(t, e.Close()) }()
	for range 3 {
		s, err := sched.NewSession(context.Background(), chain(t), devs(cpu), sched.WithExecutor(e), quiet)
		require.NoError(t, err)
		runChain(t, s, 9)
		require.NoError(t, s.Close())
	}
	assert.Equal(t, int32(3), cpu.prepares.Load(), "each chain has its own constant")
	assert.Equal(t, int32(1), cpu.liveExes.Load(), "only one idle executable is kept")
}

func TestDeadNodes(t *testing.T) {
	g := core.NewGraph()
	x := g.Input("x", core.F32, 4)
	y := g.Named("used").Scale(x, 3, 0)
	g.Named("unused").SiLU(x)
	g.Output(y)
	require.NoError(t, g.Err())
	npu := newFake("qnn", core.DeviceNPU, core.OpScale)
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	s, err := sched.NewSession(context.Background(), g, devs(npu, cpu), quiet)
	require.NoError(t, err)
	defer s.Close()
	r := s.Report()
	assert.Equal(t, 1, r.Partitions)
	assert.Equal(t, -1, r.Nodes[1].Partition)
	assert.Contains(t, r.String(), "unused")
	out, err := s.Run(context.Background(), [][]byte{core.EncodeF32([]float32{1, 2, 3, 4})})
	require.NoError(t, err)
	assert.Equal(t, []float32{3, 6, 9, 12}, core.DecodeF32(out[0]))
}

func TestRunErrorsAreWrapped(t *testing.T) {
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	s, err := sched.NewSession(context.Background(), chain(t), devs(cpu), quiet)
	require.NoError(t, err)
	defer s.Close()
	cpu.rendezvous = newRendezvous(2) // nobody else comes: the execution waits for ctx
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err = s.Run(ctx, [][]byte{core.EncodeF32(input(0))})
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.DeadlineExceeded))
	assert.Contains(t, err.Error(), "neon:0: graph/p0 ", "the error names the unit and the partition")
}
