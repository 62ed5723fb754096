package ref

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// scaleGraph is y = 2x + 1 over f32 [n].
func scaleGraph(t *testing.T, n int64) *core.Graph {
	t.Helper()
	g := core.NewGraph()
	x := g.Input("x", core.F32, n)
	g.Output(g.Scale(x, 2, 1))
	require.NoError(t, g.Err())
	return g
}

func newContext(t *testing.T) core.Context {
	t.Helper()
	b := New()
	devs := b.Devices()
	require.Len(t, devs, 1)
	c, err := devs[0].NewContext(context.Background(), map[string]string{"threads": "2"})
	require.NoError(t, err)
	return c
}

func TestBackendInfo(t *testing.T) {
	b := New()
	assert.Equal(t, "ref", b.Info().Name)
	assert.NotEmpty(t, b.Info().BuildID)
	d := b.Devices()[0].Info()
	assert.Equal(t, "ref:0", d.ID())
	assert.Equal(t, core.DeviceCPU, d.Kind)
	assert.True(t, d.Caps.Has(core.CapImportHost|core.CapHostVisible|core.CapConcurrent))
	assert.False(t, d.Caps.Has(core.CapAsync))
	for _, op := range core.AllOps() {
		assert.Equal(t, core.VerdictYes, b.Devices()[0].OpSupport(core.OpQuery{Op: op}), op.String())
	}
	assert.Equal(t, core.VerdictNo, b.Devices()[0].OpSupport(core.OpQuery{Op: core.OpInvalid}))

	require.NoError(t, b.Close())
	_, err := b.Devices()[0].NewContext(context.Background(), nil)
	assert.ErrorIs(t, err, core.ErrInvalidHandle)
}

func TestExecutionThroughBuffers(t *testing.T) {
	ctx := context.Background()
	c := newContext(t)
	g := scaleGraph(t, 3)

	v, err := c.Analyze(ctx, g)
	require.NoError(t, err)
	assert.Equal(t, []core.NodeVerdict{{Supported: true, Precision: core.PrecF32}}, v)

	exe, err := c.Prepare(ctx, g)
	require.NoError(t, err)
	assert.Len(t, exe.Verdicts(), 1)
	_, err = exe.Serialize()
	assert.ErrorIs(t, err, core.ErrUnsupported)

	host := make([]byte, 16) // 4 bytes of padding, then x at offset 4
	copy(host[4:], core.EncodeF32([]float32{1, 2, 3}))
	in, err := c.Import(host)
	require.NoError(t, err)
	out, err := c.Alloc(12, core.BufferHostVisible)
	require.NoError(t, err)

	x, err := exe.NewExecution()
	require.NoError(t, err)
	require.NoError(t, x.Bind(0, in, 4))
	require.NoError(t, x.Bind(1, out, 0))
	require.NoError(t, x.Run(ctx))
	got := make([]byte, 12)
	require.NoError(t, out.Read(0, got))
	assert.Equal(t, []float32{3, 5, 7}, core.DecodeF32(got))

	// Import is zero-copy: a write to the host slice is what the next run reads.
	copy(host[4:], core.EncodeF32([]float32{10, 20, 30}))
	require.NoError(t, x.Run(ctx))
	m, err := out.Map()
	require.NoError(t, err)
	assert.Equal(t, []float32{21, 41, 61}, core.DecodeF32(m))
	require.NoError(t, out.Unmap())
	assert.ErrorIs(t, out.Unmap(), core.ErrBadState)

	// The context refuses to close while its objects live.
	assert.ErrorIs(t, c.Close(), core.ErrBadState)
	require.NoError(t, x.Close())
	require.NoError(t, exe.Close())
	require.NoError(t, in.Close())
	require.NoError(t, out.Close())
	assert.ErrorIs(t, out.Close(), core.ErrInvalidHandle)
	require.NoError(t, c.Close())
	_, err = c.Alloc(4, core.BufferDevice)
	assert.ErrorIs(t, err, core.ErrInvalidHandle)
}

func TestBindAndRunErrors(t *testing.T) {
	ctx := context.Background()
	c := newContext(t)
	exe, err := c.Prepare(ctx, scaleGraph(t, 3))
	require.NoError(t, err)
	buf, err := c.Alloc(12, core.BufferDevice)
	require.NoError(t, err)
	small, err := c.Alloc(8, core.BufferDevice)
	require.NoError(t, err)
	foreign, err := newContext(t).Alloc(12, core.BufferDevice)
	require.NoError(t, err)
	x, err := exe.NewExecution()
	require.NoError(t, err)

	assert.ErrorIs(t, x.Run(ctx), core.ErrBadState, "run before bind")
	tests := []struct {
		name string
		io   int
		buf  core.Buffer
		off  int64
	}{
		{"io negative", -1, buf, 0},
		{"io past outputs", 2, buf, 0},
		{"buffer too small", 0, small, 0},
		{"offset past end", 0, buf, 4},
		{"negative offset", 0, buf, -4},
		{"foreign buffer", 0, foreign, 0},
		{"nil buffer", 0, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorIs(t, x.Bind(tc.io, tc.buf, tc.off), core.ErrInvalidArgument)
		})
	}
	require.NoError(t, x.Bind(0, buf, 0))
	assert.ErrorIs(t, x.Run(ctx), core.ErrBadState, "output not bound")
	require.NoError(t, x.Bind(1, buf, 0)) // in place: outputs are written after the run
	require.NoError(t, buf.Write(0, core.EncodeF32([]float32{1, 2, 3})))
	require.NoError(t, x.Run(ctx))
	got := make([]byte, 12)
	require.NoError(t, buf.Read(0, got))
	assert.Equal(t, []float32{3, 5, 7}, core.DecodeF32(got))
	assert.ErrorIs(t, buf.Write(8, make([]byte, 8)), core.ErrInvalidArgument)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	assert.ErrorIs(t, x.Run(cancelled), context.Canceled)

	require.NoError(t, buf.Close())
	assert.ErrorIs(t, x.Run(ctx), core.ErrInvalidHandle, "buffer closed after bind")

	_, err = c.Prepare(ctx, core.NewGraph())
	assert.ErrorIs(t, err, core.ErrGraph, "graph without outputs")
	_, err = c.Prepare(ctx, nil)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	_, err = c.Alloc(-1, core.BufferDevice)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	_, err = c.Alloc(1<<62, core.BufferDevice)
	assert.ErrorIs(t, err, core.ErrOutOfMemory)
	_, err = c.ImportFD(3, 0, 8)
	assert.ErrorIs(t, err, core.ErrUnsupported)
	require.NoError(t, exe.Close())
	_, err = exe.NewExecution()
	assert.ErrorIs(t, err, core.ErrInvalidHandle)
}

func TestRunInputErrors(t *testing.T) {
	g := scaleGraph(t, 3)
	_, err := Run(context.Background(), g, nil)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	_, err = Run(context.Background(), g, [][]byte{make([]byte, 8)})
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
}

func TestCancelBetweenNodes(t *testing.T) {
	g := core.NewGraph()
	x := g.Input("x", core.F32, 2)
	y := x
	for i := 0; i < 3; i++ {
		y = g.Scale(y, 1, 1)
	}
	g.Output(y)
	require.NoError(t, g.Err())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Run(ctx, g, [][]byte{make([]byte, 8)})
	assert.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "scale")
}

func TestConcurrentRuns(t *testing.T) {
	ctx := context.Background()
	c := newContext(t)
	const n = 64
	g := scaleGraph(t, n)
	exe, err := c.Prepare(ctx, g)
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := 0; w < 8; w++ {
		wg.Add(2)
		go func(w int) { // own execution and buffers
			defer wg.Done()
			errs <- func() error {
				xs := make([]float32, n)
				for i := range xs {
					xs[i] = float32(w*n + i)
				}
				in, err := c.Import(core.EncodeF32(xs))
				if err != nil {
					return err
				}
				out, err := c.Alloc(4*n, core.BufferDevice)
				if err != nil {
					return err
				}
				x, err := exe.NewExecution()
				if err != nil {
					return err
				}
				if err := errors.Join(x.Bind(0, in, 0), x.Bind(1, out, 0)); err != nil {
					return err
				}
				for r := 0; r < 5; r++ {
					if err := x.Run(ctx); err != nil {
						return err
					}
				}
				b := make([]byte, 4*n)
				if err := out.Read(0, b); err != nil {
					return err
				}
				for i, y := range core.DecodeF32(b) {
					if y != 2*xs[i]+1 {
						return errors.New("wrong result")
					}
				}
				return errors.Join(x.Close(), in.Close(), out.Close())
			}()
		}(w)
		go func() { // the convenience path on the same graph
			defer wg.Done()
			_, err := Run(ctx, g, [][]byte{make([]byte, 4*n)})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, exe.Close())
	require.NoError(t, c.Close())
}

func TestSharedExecutionIsSerialized(t *testing.T) {
	ctx := context.Background()
	c := newContext(t)
	exe, err := c.Prepare(ctx, scaleGraph(t, 4))
	require.NoError(t, err)
	in, err := c.Alloc(16, core.BufferDevice)
	require.NoError(t, err)
	out, err := c.Alloc(16, core.BufferDevice)
	require.NoError(t, err)
	x, err := exe.NewExecution()
	require.NoError(t, err)
	require.NoError(t, x.Bind(0, in, 0))
	require.NoError(t, x.Bind(1, out, 0))
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, x.Run(ctx))
		}()
	}
	wg.Wait()
}

func TestFences(t *testing.T) {
	ctx := context.Background()
	c := newContext(t)
	f, err := c.NewFence(5)
	require.NoError(t, err)
	v, err := f.Value()
	require.NoError(t, err)
	assert.Equal(t, uint64(5), v)
	require.NoError(t, f.Wait(ctx, 3), "already reached")
	assert.ErrorIs(t, f.Signal(5), core.ErrInvalidArgument, "must advance")

	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, f.Wait(short, 6), core.ErrTimeout)

	done := make(chan error, 1)
	go func() { done <- f.Wait(ctx, 7) }()
	require.NoError(t, f.Signal(6))
	require.NoError(t, f.Signal(7))
	require.NoError(t, <-done)

	go func() { done <- f.Wait(ctx, 100) }()
	require.NoError(t, f.Close())
	assert.ErrorIs(t, <-done, core.ErrInvalidHandle, "close wakes waiters")
	assert.ErrorIs(t, f.Signal(8), core.ErrInvalidHandle)
}

func TestSubmitChain(t *testing.T) {
	ctx := context.Background()
	c := newContext(t)
	exe, err := c.Prepare(ctx, scaleGraph(t, 1))
	require.NoError(t, err)
	in, err := c.Alloc(4, core.BufferHostVisible)
	require.NoError(t, err)
	mid, err := c.Alloc(4, core.BufferHostVisible)
	require.NoError(t, err)
	out, err := c.Alloc(4, core.BufferHostVisible)
	require.NoError(t, err)
	first, err := exe.NewExecution()
	require.NoError(t, err)
	second, err := exe.NewExecution()
	require.NoError(t, err)
	require.NoError(t, errors.Join(first.Bind(0, in, 0), first.Bind(1, mid, 0), second.Bind(0, mid, 0), second.Bind(1, out, 0)))
	start, err := c.NewFence(0)
	require.NoError(t, err)
	between, err := c.NewFence(0)
	require.NoError(t, err)

	// The second waits for the first, which waits for the start signal.
	res := make(chan error, 2)
	go func() { res <- second.Submit([]core.FencePoint{{Fence: between, Value: 1}}, nil) }()
	go func() {
		res <- first.Submit([]core.FencePoint{{Fence: start, Value: 1}}, &core.FencePoint{Fence: between, Value: 1})
	}()
	require.NoError(t, in.Write(0, core.EncodeF32([]float32{3})))
	require.NoError(t, start.Signal(1))
	require.NoError(t, <-res)
	require.NoError(t, <-res)
	got := make([]byte, 4)
	require.NoError(t, out.Read(0, got))
	assert.Equal(t, []float32{15}, core.DecodeF32(got)) // 2*(2*3+1)+1

	assert.ErrorIs(t, first.Submit([]core.FencePoint{{}}, nil), core.ErrInvalidArgument)
	assert.ErrorIs(t, first.Submit(nil, &core.FencePoint{}), core.ErrInvalidArgument)
}
