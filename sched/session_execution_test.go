package sched_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/sched"
)

// kvGraph is x [1,4] -> k = 2x ("k", output 0) and y = k + x ("y", output 1): k plays the part
// of an attention K row appended to a cache.
func kvGraph(t *testing.T) *core.Graph {
	g := core.NewGraph()
	x := g.Input("x", core.F32, 1, 4)
	k := g.Named("k").Scale(x, 2, 0)
	g.Output(k, g.Named("y").Add(k, x))
	require.NoError(t, g.Err())
	return g
}

func readF32(t *testing.T, b core.Buffer, off int64, n int) []float32 {
	raw := make([]byte, 4*n)
	require.NoError(t, b.Read(off, raw))
	return core.DecodeF32(raw)
}

func TestExecutionKVCache(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		npuOps   []core.Op
		cacheOn  string // device of the cache buffer
		kOn      string // device k is placed on
		copies   int64  // per run
		allocs   int32  // device buffers: the arena mirror of each unit (the fakes import nothing)
		rebindTo string // device of a second cache the k output moves to, "" for none
	}{
		// everything on the cpu: every binding is used in place
		{"one device", nil, "neon", "neon:0", 0, 1, ""},
		// k on the npu, cache on the cpu: k crosses to the cpu for y (the buffers are arena
		// memory: wherever the caller allocated them, every unit reads and writes them in place)
		{"cache on the consumer's device", []core.Op{core.OpScale}, "neon", "qnn:0", 1, 2, ""},
		// cache on the npu where k is made: k is written in place, y's input k crosses
		{"cache on the producer's device", []core.Op{core.OpScale}, "qnn", "qnn:0", 1, 2, ""},
		// rebinding the cache from the npu to the cpu between runs
		{"rebind across devices", []core.Op{core.OpScale}, "qnn", "qnn:0", 1, 2, "neon"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			npu := newFake("qnn", core.DeviceNPU, tt.npuOps...)
			cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
			byName := map[string]core.Device{"qnn": npu, "neon": cpu}
			s, err := sched.NewSession(ctx, kvGraph(t), devs(npu, cpu), sched.WithPolicy(sched.PreferNPU), quiet)
			require.NoError(t, err)
			assert.Equal(t, tt.kOn, s.Report().Nodes[0].Unit)

			const rows = 3
			cache, err := s.Alloc(ctx, byName[tt.cacheOn], rows*16, core.BufferDevice)
			require.NoError(t, err)
			xb, err := s.Alloc(ctx, cpu, 16, core.BufferDevice)
			require.NoError(t, err)
			yb, err := s.Alloc(ctx, cpu, 16, core.BufferDevice)
			require.NoError(t, err)
			x, err := s.NewExecution()
			require.NoError(t, err)
			require.NoError(t, x.Bind(0, xb, 0))
			require.NoError(t, x.Bind(2, yb, 0))
			for row := range rows {
				xs := []float32{float32(row), 1, 2, 3}
				require.NoError(t, xb.Write(0, core.EncodeF32(xs)))
				require.NoError(t, x.Bind(1, cache, int64(row)*16))
				require.NoError(t, x.Run(ctx))
				assert.Equal(t, []float32{float32(3 * row), 3, 6, 9}, readF32(t, yb, 0, 4))
			}
			for row := range rows {
				assert.Equal(t, []float32{float32(2 * row), 2, 4, 6}, readF32(t, cache, int64(row)*16, 4), "row %d", row)
			}
			assert.Equal(t, rows*tt.copies, s.Report().Copies)
			assert.Equal(t, tt.allocs, npu.allocs.Load()+cpu.allocs.Load(), "device buffers allocated")

			if tt.rebindTo != "" {
				other, err := s.Alloc(ctx, byName[tt.rebindTo], 16, core.BufferDevice)
				require.NoError(t, err)
				require.NoError(t, x.Bind(1, other, 0))
				require.NoError(t, xb.Write(0, core.EncodeF32([]float32{5, 5, 5, 5})))
				require.NoError(t, x.Run(ctx))
				assert.Equal(t, []float32{10, 10, 10, 10}, readF32(t, other, 0, 4))
				assert.Equal(t, []float32{15, 15, 15, 15}, readF32(t, yb, 0, 4))
				assert.Equal(t, []float32{4, 2, 4, 6}, readF32(t, cache, 32, 4), "the old cache is left alone")
				require.NoError(t, other.Close())
			}

			require.NoError(t, x.Close())
			for _, b := range []core.Buffer{cache, xb, yb} {
				require.NoError(t, b.Close())
			}
			require.NoError(t, s.Close())
			assert.Zero(t, npu.liveContexts.Load()+cpu.liveContexts.Load())
		})
	}
}

func TestExecutionErrors(t *testing.T) {
	ctx := context.Background()
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	stranger := newFake("opencl", core.DeviceGPU, allFakeOps...)
	e := sched.NewExecutor(quiet)
	defer func() { require.NoError(t, e.Close()) }()
	s, err := sched.NewSession(ctx, kvGraph(t), devs(cpu), sched.WithExecutor(e), quiet)
	require.NoError(t, err)
	x, err := s.NewExecution()
	require.NoError(t, err)

	b, err := s.Alloc(ctx, cpu, 16, core.BufferDevice)
	require.NoError(t, err)
	defer b.Close()
	foreign, err := e.Alloc(ctx, stranger, 16, core.BufferDevice)
	require.NoError(t, err)
	defer foreign.Close()
	rawCtx, err := cpu.NewContext(ctx, nil)
	require.NoError(t, err)
	raw, err := rawCtx.Alloc(16, core.BufferDevice)
	require.NoError(t, err)

	assert.ErrorIs(t, x.Bind(3, b, 0), core.ErrInvalidArgument, "no such binding")
	assert.ErrorIs(t, x.Bind(-1, b, 0), core.ErrInvalidArgument)
	assert.ErrorIs(t, x.Bind(0, raw, 0), core.ErrInvalidArgument, "not from Alloc")
	assert.ErrorIs(t, x.Bind(0, nil, 0), core.ErrInvalidArgument)
	assert.ErrorIs(t, x.Bind(0, foreign, 0), core.ErrInvalidArgument, "device not in the session")
	assert.ErrorIs(t, x.Bind(0, b, 4), core.ErrInvalidArgument, "does not fit")
	assert.ErrorIs(t, x.Bind(0, b, -1), core.ErrInvalidArgument)
	require.NoError(t, x.Bind(0, b, 0))
	assert.ErrorIs(t, x.Run(ctx), core.ErrBadState, "outputs unbound")
	require.NoError(t, raw.Close())
	require.NoError(t, rawCtx.Close())

	// Closing the session closes the executions left open.
	require.NoError(t, s.Close())
	assert.ErrorIs(t, x.Run(ctx), core.ErrBadState)
	assert.ErrorIs(t, x.Bind(0, b, 0), core.ErrBadState)
	require.NoError(t, x.Close())
	_, err = s.NewExecution()
	assert.ErrorIs(t, err, core.ErrBadState)
}

// TestExecutionMatchesRun drives the split transformer block through an Execution with ref
// buffers and compares with Session.Run.
func TestExecutionMatchesRun(t *testing.T) {
	ctx := context.Background()
	refB := ref.New()
	defer refB.Close()
	refDev := refB.Devices()[0]
	npu := &pickyDevice{Device: refDev, backend: "npu-sim", kind: core.DeviceNPU,
		accepts: map[core.Op]bool{core.OpMatMul: true}}
	e := sched.NewExecutor(quiet)
	defer func() { require.NoError(t, e.Close()) }()
	s, err := sched.NewSession(ctx, block(t), []core.Device{npu, refDev}, sched.WithExecutor(e), quiet)
	require.NoError(t, err)
	defer s.Close()

	in := blockInputs(42)
	want, err := s.Run(ctx, in)
	require.NoError(t, err)

	x, err := s.NewExecution()
	require.NoError(t, err)
	defer x.Close()
	var bufs []core.Buffer
	for i, data := range append(in, make([]byte, len(want[0]))) {
		dev := core.Device(refDev)
		if i == 1 {
			dev = npu // positions live on the npu: read by RoPE on ref, so copied
		}
		b, err := e.Alloc(ctx, dev, int64(len(data)), core.BufferDevice)
		require.NoError(t, err)
		defer b.Close()
		require.NoError(t, b.Write(0, data))
		require.NoError(t, x.Bind(i, b, 0))
		bufs = append(bufs, b)
	}
	require.NoError(t, x.Run(ctx))
	got := make([]byte, len(want[0]))
	require.NoError(t, bufs[2].Read(0, got))
	assert.Equal(t, want[0], got)
}

// TestExecutorAllocBuffers: Alloc's buffers are arena memory, bounds-checked, and unusable once
// closed or once the executor (and its arena) is.
func TestExecutorAllocBuffers(t *testing.T) {
	ctx := context.Background()
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	e := sched.NewExecutor(quiet)
	_, err := e.Alloc(ctx, cpu, 0, core.BufferDevice)
	assert.ErrorIs(t, err, core.ErrInvalidArgument, "an empty buffer")
	_, err = e.Alloc(ctx, nil, 16, core.BufferDevice)
	assert.ErrorIs(t, err, core.ErrInvalidArgument, "no device")
	a, err := e.Alloc(ctx, cpu, 10, core.BufferDevice)
	require.NoError(t, err)
	b, err := e.Alloc(ctx, cpu, 10, core.BufferDevice)
	require.NoError(t, err)
	assert.EqualValues(t, 10, a.Size())
	require.NoError(t, a.Write(2, []byte{1, 2, 3}))
	require.NoError(t, b.Write(0, make([]byte, 10)), "a's neighbour")
	got := make([]byte, 4)
	require.NoError(t, a.Read(1, got))
	assert.Equal(t, []byte{0, 1, 2, 3}, got)
	m, err := a.Map()
	require.NoError(t, err)
	assert.Len(t, m, 10)
	require.NoError(t, a.Unmap())
	for _, tt := range []struct {
		name string
		off  int64
		n    int
	}{{"past the end", 8, 3}, {"negative offset", -1, 1}, {"offset past the end", 11, 0}} {
		assert.ErrorIs(t, a.Write(tt.off, make([]byte, tt.n)), core.ErrInvalidArgument, tt.name)
		assert.ErrorIs(t, a.Read(tt.off, make([]byte, tt.n)), core.ErrInvalidArgument, tt.name)
	}
	require.NoError(t, a.Close())
	assert.ErrorIs(t, a.Read(0, got), core.ErrBadState, "a closed buffer")
	require.NoError(t, e.Close())
	assert.ErrorIs(t, b.Write(0, got), core.ErrBadState, "the executor closed")
	_, err = b.Map()
	assert.ErrorIs(t, err, core.ErrBadState)
	_, err = e.Alloc(ctx, cpu, 16, core.BufferDevice)
	assert.ErrorIs(t, err, core.ErrBadState)
}
