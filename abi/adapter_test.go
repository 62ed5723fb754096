package abi

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// fakeCalls is a Calls that records what the adapter asks of it. Entries a test does not use
// are left to the embedded nil interface (calling one panics: the adapter asked for something
// unexpected).
type fakeCalls struct {
	Calls
	next      uint64
	allocs    int
	writes    int
	released  []uint64
	analyze   func(n uint32) ([]RawVerdict, error)
	prepared  int
	fenceWait func(call int) error
	waits     int
}

func (f *fakeCalls) handle() uint64 { f.next++; return f.next }

func (f *fakeCalls) ContextCreate(context.Context, uint32, string) (uint64, error) {
	return f.handle(), nil
}
func (f *fakeCalls) ContextRelease(h uint64) error { f.released = append(f.released, h); return nil }
func (f *fakeCalls) BufferAlloc(uint64, uint64, core.BufferKind) (uint64, error) {
	f.allocs++
	return f.handle(), nil
}
func (f *fakeCalls) BufferWrite(uint64, uint64, []byte) error { f.writes++; return nil }
func (f *fakeCalls) BufferRelease(h uint64) error {
	f.released = append(f.released, h)
	return nil
}
func (f *fakeCalls) GraphAnalyze(_ context.Context, _ uint64, _ []byte, n uint32) ([]RawVerdict, error) {
	return f.analyze(n)
}
func (f *fakeCalls) GraphPrepare(context.Context, uint64, []byte, string, []byte) (uint64, error) {
	f.prepared++
	return f.handle(), nil
}
func (f *fakeCalls) ExecutableRelease(h uint64) error {
	f.released = append(f.released, h)
	return nil
}
func (f *fakeCalls) FenceCreate(uint64, uint64) (uint64, error) { return f.handle(), nil }
func (f *fakeCalls) FenceWait(uint64, uint64, time.Duration) error {
	f.waits++
	return f.fenceWait(f.waits)
}
func (f *fakeCalls) FenceRelease(h uint64) error { f.released = append(f.released, h); return nil }

func fakeContext(t *testing.T, f *fakeCalls) core.Context {
	t.Helper()
	d := NewDevice(func() (Calls, error) { return f, nil }, 0,
		core.DeviceInfo{Backend: "fake", Kind: core.DeviceCPU, Caps: core.CapImportFD})
	cx, err := d.NewContext(context.Background(), nil)
	require.NoError(t, err)
	return cx
}

func scaledGraph(w []byte) *core.Graph {
	g := core.NewGraph()
	x := g.Input("x", core.F32, 4)
	g.Output(g.Mul(x, g.Const("w", core.F32, core.Shape{4}, w)))
	return g
}

func allYes(n uint32) ([]RawVerdict, error) {
	vs := make([]RawVerdict, n)
	for i := range vs {
		vs[i].Verdict = core.VerdictYes
	}
	return vs, nil
}

// TestAdapterConstantsAndLifecycle: a weight shared by two graphs is uploaded once per
// context (a device without host import gets it written, once), a context does not close
// under a live executable, and closing it releases the constant, then the context.
func TestAdapterConstantsAndLifecycle(t *testing.T) {
	f := &fakeCalls{analyze: allYes}
	cx := fakeContext(t, f)
	w := make([]byte, 16)
	e1, err := cx.Prepare(context.Background(), scaledGraph(w))
	require.NoError(t, err)
	e2, err := cx.Prepare(context.Background(), scaledGraph(w))
	require.NoError(t, err)
	assert.Equal(t, 1, f.allocs, "one upload of the shared weight")
	assert.Equal(t, 1, f.writes)
	assert.Equal(t, 2, f.prepared)

	require.ErrorIs(t, cx.Close(), core.ErrBadState, "executables are still open")
	require.NoError(t, e1.Close())
	require.NoError(t, e2.Close())
	require.NoError(t, e2.Close(), "a second close is a no-op")
	require.NoError(t, cx.Close())
	// context 1, weight 2, executables 3 and 4: executables, then the weight, then the context
	assert.Equal(t, []uint64{3, 4, 2, 1}, f.released)
	_, err = cx.Alloc(4, core.BufferDevice)
	require.ErrorIs(t, err, core.ErrBadState, "the context is closed")
}

// TestAdapterPrepareAnalysis: refused nodes fail a prepare without asking the plugin to
// prepare, a plugin without graph_analyze (UNSUPPORTED) is asked to prepare directly, and a
// wrong number of verdicts is an error of the plugin's.
func TestAdapterPrepareAnalysis(t *testing.T) {
	tests := []struct {
		name     string
		analyze  func(n uint32) ([]RawVerdict, error)
		wantErr  error
		prepared int
	}{
		{"all supported", allYes, nil, 1},
		{"refused", func(n uint32) ([]RawVerdict, error) {
			vs, _ := allYes(n)
			vs[0] = RawVerdict{Verdict: core.VerdictNo, Reason: "no MUL today"}
			return vs, nil
		}, core.ErrUnsupported, 0},
		{"no graph_analyze", func(uint32) ([]RawVerdict, error) {
			return nil, fmt.Errorf("fake graph_analyze: %w", StatusUnsupported.Err(""))
		}, nil, 1},
		{"short answer", func(uint32) ([]RawVerdict, error) { return nil, nil }, core.ErrInternal, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeCalls{analyze: tt.analyze}
			cx := fakeContext(t, f)
			exe, err := cx.Prepare(context.Background(), scaledGraph(make([]byte, 16)))
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
			} else {
				require.NoError(t, err)
				require.NoError(t, exe.Close())
			}
			assert.Equal(t, tt.prepared, f.prepared)
			if tt.name == "refused" {
				assert.Contains(t, err.Error(), "no MUL today")
			}
		})
	}
}

// TestAdapterFenceWait: a wait repeats slices that time out, and stops at any other answer,
// including a backend that crashed because a call overran its timeout (an error that wraps
// core.ErrTimeout too, and must not be taken for a slice that timed out).
func TestAdapterFenceWait(t *testing.T) {
	crashed := fmt.Errorf("isolated fake: fence_wait did not return (%w); killed: %w", core.ErrTimeout,
		core.ErrBackendCrashed)
	tests := []struct {
		name  string
		wait  func(call int) error
		want  error
		waits int
	}{
		{"signalled after two slices", func(call int) error {
			if call < 3 {
				return fmt.Errorf("fake fence_wait: %w", StatusTimeout.Err(""))
			}
			return nil
		}, nil, 3},
		{"crash after a slice", func(call int) error {
			if call < 2 {
				return fmt.Errorf("fake fence_wait: %w", StatusTimeout.Err(""))
			}
			return crashed
		}, core.ErrBackendCrashed, 2},
		{"invalid handle", func(int) error { return StatusInvalidHandle.Err("") }, core.ErrInvalidHandle, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeCalls{fenceWait: tt.wait}
			cx := fakeContext(t, f)
			fe, err := cx.NewFence(0)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = fe.Wait(ctx, 1)
			if tt.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tt.want)
				require.False(t, errors.Is(err, context.DeadlineExceeded), "the wait ended on its answer")
			}
			assert.Equal(t, tt.waits, f.waits)
			require.NoError(t, fe.Close())
			require.NoError(t, cx.Close())
		})
	}
}

func TestIsWaitTimeout(t *testing.T) {
	assert.True(t, IsWaitTimeout(fmt.Errorf("x: %w", StatusTimeout.Err("slice"))))
	assert.False(t, IsWaitTimeout(nil))
	assert.False(t, IsWaitTimeout(core.ErrTimeout), "a timeout that is no plugin answer")
	assert.False(t, IsWaitTimeout(StatusInvalidHandle.Err("")))
	assert.False(t, IsWaitTimeout(fmt.Errorf("%w; %w", StatusTimeout.Err(""), core.ErrBackendCrashed)))
}
