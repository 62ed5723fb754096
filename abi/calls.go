package abi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xpuhub/xpu/core"
)

// Calls is the plugin function table seen at the level of handles, one method per entry that
// the core.Backend adapter (NewDevice) uses, each failure a Go error (a *StatusError with the
// plugin's last_error text where the plugin answered, anything else where the call never got an
// answer, e.g. core.ErrBackendCrashed). It is the one seam between the adapter and how a plugin
// is reached: in process (over purego, PluginCalls) or in a child process (package loader).
// An ABI entry added to the adapter is added here and to both implementations.
//
// Implementations do no lifecycle or range checking (the adapter does) beyond what keeps the
// host's memory safe. A release of anything in a plugin that is gone (a dead child) frees this
// side's resources and succeeds: there is nothing left to release.
type Calls interface {
	OpSupport(dev uint32, q core.OpQuery) (core.Verdict, error)
	ContextCreate(ctx context.Context, dev uint32, opts string) (uint64, error)
	ContextRelease(cx uint64) error

	BufferAlloc(cx, size uint64, kind core.BufferKind) (uint64, error)
	// BufferImportHost imports mem, which the caller keeps alive and unmoved while the buffer
	// lives. Only devices with core.CapImportHost are asked.
	BufferImportHost(cx uint64, mem []byte) (uint64, error)
	BufferImportFD(cx uint64, fd int, offset, size uint64) (uint64, error)
	BufferWrite(buf, offset uint64, src []byte) error
	BufferRead(buf, offset uint64, dst []byte) error
	// BufferMap returns the buffer's bytes, valid until BufferUnmap or BufferRelease.
	BufferMap(buf uint64) ([]byte, error)
	BufferUnmap(buf uint64) error
	BufferRelease(buf uint64) error

	// GraphAnalyze answers one verdict per node (n of them).
	GraphAnalyze(ctx context.Context, cx uint64, ir []byte, n uint32) ([]RawVerdict, error)
	GraphPrepare(ctx context.Context, cx uint64, ir []byte, opts string, cache []byte) (uint64, error)
	ExecutableSerialize(exe uint64) ([]byte, error)
	ExecutableRelease(exe uint64) error

	ExecutionCreate(exe uint64) (uint64, error)
	ExecutionBind(ex uint64, io uint32, buf, offset uint64) error
	ExecutionSubmit(ex uint64, waits []FencePoint, signal *FencePoint) error
	// ExecutionRun runs ex until it is done or ctx ends. hist is the run history of ex's
	// executable, kept by the adapter for implementations that bound a run by earlier ones.
	ExecutionRun(ctx context.Context, ex uint64, hist *RunHistory) error
	ExecutionRelease(ex uint64) error

	FenceCreate(cx, initial uint64) (uint64, error)
	// FenceWait waits at most timeout; a wait that timed out is a *StatusError with
	// StatusTimeout (see IsWaitTimeout).
	FenceWait(f, value uint64, timeout time.Duration) error
	FenceValue(f uint64) (uint64, error)
	FenceSignal(f, value uint64) error
	FenceRelease(f uint64) error
}

// RunHistory is what an adapter remembers of one executable's runs for its Calls: the longest
// successful run so far (an isolated backend's automatic execute deadline follows it).
type RunHistory struct {
	longest atomic.Int64 // ns
}

// Longest is the longest run recorded so far (0 before any).
func (h *RunHistory) Longest() time.Duration { return time.Duration(h.longest.Load()) }

// Record notes a run of d. Racing runs may lose a new maximum; the next run sets it.
func (h *RunHistory) Record(d time.Duration) {
	if d > h.Longest() {
		h.longest.Store(int64(d))
	}
}

// RunHistoryOf returns the run history of the executable of an execution made by NewDevice's
// adapter, or nil for any other execution.
func RunHistoryOf(x core.Execution) *RunHistory {
	if ex, ok := x.(*execution); ok {
		return &ex.e.hist
	}
	return nil
}

// IsWaitTimeout reports whether err is a fence wait that timed out (and so may be repeated), as
// opposed to one that failed, including a backend that crashed during the wait.
func IsWaitTimeout(err error) bool {
	se := (*StatusError)(nil)
	return errors.As(err, &se) && se.Status == StatusTimeout && !errors.Is(err, core.ErrBackendCrashed)
}

// PluginCalls is Calls over a plugin opened in this process: each call is the raw API's, its
// status turned into an error with the handle's last_error text (Plugin.Err).
type PluginCalls struct {
	p       *Plugin
	orphans orphanRuns
}

// orphanWait bounds how long a call waits for runs their callers gave up on (settle).
var orphanWait = 10 * time.Second // a variable for the tests

// orphanRuns counts the execution_run calls whose callers stopped waiting (their context
// ended) while the plugin went on. Until they end, the plugin may still write their outputs,
// into buffers the next request reuses: every execution call of the plugin waits for them
// first. An uncanceled request never pays more than an atomic load.
type orphanRuns struct {
	any  atomic.Bool // n > 0
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n returns to 0
}

// add counts a run given up on; done delivers its status when the plugin returns.
func (o *orphanRuns) add(done <-chan Status) {
	o.mu.Lock()
	if o.n == 0 {
		o.idle = make(chan struct{})
		o.any.Store(true)
	}
	o.n++
	o.mu.Unlock()
	go func() {
		<-done
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.n--; o.n == 0 {
			o.any.Store(false)
			close(o.idle)
		}
	}()
}

// settle returns once no run given up on is left in the plugin. It waits until ctx ends, and
// at most orphanWait: a run still in the plugin then is a hung one, and the call answers
// BAD_STATE as the plugin would (a context without a deadline must not wait forever).
func (c *PluginCalls) settle(ctx context.Context, entry string) error {
	o := &c.orphans
	if !o.any.Load() {
		return nil
	}
	o.mu.Lock()
	idle, n := o.idle, o.n
	o.mu.Unlock()
	if n == 0 {
		return nil
	}
	t := time.NewTimer(orphanWait)
	defer t.Stop()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s %s: waiting for a run given up on earlier: %w", c.p.probe.Name, entry, ctx.Err())
	case <-t.C:
		return fmt.Errorf("%s %s: a run its caller gave up on is still in the plugin after %v: %w", c.p.probe.Name,
			entry, orphanWait, core.ErrBadState)
	}
}

var _ Calls = (*PluginCalls)(nil)

// NewPluginCalls returns the Calls of an opened plugin.
func NewPluginCalls(p *Plugin) *PluginCalls { return &PluginCalls{p: p} }

// OpSupport calls op_support.
func (c *PluginCalls) OpSupport(dev uint32, q core.OpQuery) (core.Verdict, error) {
	v, st := c.p.OpSupport(dev, q)
	return v, c.p.Err("op_support", 0, st)
}

// ContextCreate calls context_create.
func (c *PluginCalls) ContextCreate(_ context.Context, dev uint32, opts string) (uint64, error) {
	h, st := c.p.ContextCreate(dev, opts)
	return h, c.p.Err("context_create", 0, st)
}

// ContextRelease calls context_release.
func (c *PluginCalls) ContextRelease(cx uint64) error {
	return c.p.Err("context_release", cx, c.p.ContextRelease(cx))
}

// BufferAlloc calls buffer_alloc.
func (c *PluginCalls) BufferAlloc(cx, size uint64, kind core.BufferKind) (uint64, error) {
	h, st := c.p.BufferAlloc(cx, size, uint32(kind))
	return h, c.p.Err("buffer_alloc", cx, st)
}

// BufferImportHost calls buffer_import with XPU_IMPORT_HOST.
func (c *PluginCalls) BufferImportHost(cx uint64, mem []byte) (uint64, error) {
	h, st := c.p.BufferImportHost(cx, mem)
	return h, c.p.Err("buffer_import", cx, st)
}

// BufferImportFD calls buffer_import with XPU_IMPORT_FD.
func (c *PluginCalls) BufferImportFD(cx uint64, fd int, offset, size uint64) (uint64, error) {
	h, st := c.p.BufferImportFD(cx, fd, offset, size)
	return h, c.p.Err("buffer_import", cx, st)
}

// BufferWrite calls buffer_write.
func (c *PluginCalls) BufferWrite(buf, offset uint64, src []byte) error {
	return c.p.Err("buffer_write", buf, c.p.BufferWrite(buf, offset, src))
}

// BufferRead calls buffer_read.
func (c *PluginCalls) BufferRead(buf, offset uint64, dst []byte) error {
	return c.p.Err("buffer_read", buf, c.p.BufferRead(buf, offset, dst))
}

// BufferMap calls buffer_map.
func (c *PluginCalls) BufferMap(buf uint64) ([]byte, error) {
	m, st := c.p.BufferMap(buf)
	return m, c.p.Err("buffer_map", buf, st)
}

// BufferUnmap calls buffer_unmap.
func (c *PluginCalls) BufferUnmap(buf uint64) error {
	return c.p.Err("buffer_unmap", buf, c.p.BufferUnmap(buf))
}

// BufferRelease calls buffer_release.
func (c *PluginCalls) BufferRelease(buf uint64) error {
	return c.p.Err("buffer_release", buf, c.p.BufferRelease(buf))
}

// GraphAnalyze calls graph_analyze.
func (c *PluginCalls) GraphAnalyze(_ context.Context, cx uint64, ir []byte, n uint32) ([]RawVerdict, error) {
	vs, st := c.p.GraphAnalyze(cx, ir, n)
	return vs, c.p.Err("graph_analyze", cx, st)
}

// GraphPrepare calls graph_prepare.
func (c *PluginCalls) GraphPrepare(_ context.Context, cx uint64, ir []byte, opts string, cache []byte) (uint64, error) {
	h, st := c.p.GraphPrepare(cx, ir, opts, cache)
	return h, c.p.Err("graph_prepare", cx, st)
}

// ExecutableSerialize calls executable_serialize.
func (c *PluginCalls) ExecutableSerialize(exe uint64) ([]byte, error) {
	blob, st := c.p.ExecutableSerialize(exe)
	return blob, c.p.Err("executable_serialize", exe, st)
}

// ExecutableRelease calls executable_release.
func (c *PluginCalls) ExecutableRelease(exe uint64) error {
	return c.p.Err("executable_release", exe, c.p.ExecutableRelease(exe))
}

// ExecutionCreate calls execution_create.
func (c *PluginCalls) ExecutionCreate(exe uint64) (uint64, error) {
	h, st := c.p.ExecutionCreate(exe)
	return h, c.p.Err("execution_create", exe, st)
}

// ExecutionBind calls execution_bind.
func (c *PluginCalls) ExecutionBind(ex uint64, io uint32, buf, offset uint64) error {
	if err := c.settle(context.Background(), "execution_bind"); err != nil {
		return err
	}
	return c.p.Err("execution_bind", ex, c.p.ExecutionBind(ex, io, buf, offset))
}

// ExecutionSubmit calls execution_submit.
func (c *PluginCalls) ExecutionSubmit(ex uint64, waits []FencePoint, signal *FencePoint) error {
	return c.p.Err("execution_submit", ex, c.p.ExecutionSubmit(ex, waits, signal))
}

// ExecutionRun calls execution_run. A plugin call cannot be interrupted: when ctx ends first
// the run returns ctx's error while the call goes on, and the plugin's next execution calls
// wait for it (orphanRuns). hist is not needed in process.
func (c *PluginCalls) ExecutionRun(ctx context.Context, ex uint64, _ *RunHistory) error {
	if err := c.settle(ctx, "execution_run"); err != nil {
		return err
	}
	if ctx.Done() == nil {
		// nothing can cancel it: no goroutine and channel per run on the decode loop
		return c.p.Err("execution_run", ex, c.p.ExecutionRun(ex))
	}
	done := make(chan Status, 1)
	go func() { done <- c.p.ExecutionRun(ex) }()
	select {
	case st := <-done:
		return c.p.Err("execution_run", ex, st)
	case <-ctx.Done():
		c.orphans.add(done) // the next calls wait for it: it may still write its outputs
		return fmt.Errorf("%s execution_run: %w", c.p.probe.Name, ctx.Err())
	}
}

// ExecutionRelease calls execution_release.
func (c *PluginCalls) ExecutionRelease(ex uint64) error {
	if err := c.settle(context.Background(), "execution_release"); err != nil {
		return err
	}
	return c.p.Err("execution_release", ex, c.p.ExecutionRelease(ex))
}

// FenceCreate calls fence_create.
func (c *PluginCalls) FenceCreate(cx, initial uint64) (uint64, error) {
	h, st := c.p.FenceCreate(cx, initial)
	return h, c.p.Err("fence_create", cx, st)
}

// FenceWait calls fence_wait.
func (c *PluginCalls) FenceWait(f, value uint64, timeout time.Duration) error {
	return c.p.Err("fence_wait", f, c.p.FenceWait(f, value, timeout))
}

// FenceValue calls fence_value.
func (c *PluginCalls) FenceValue(f uint64) (uint64, error) {
	v, st := c.p.FenceValue(f)
	return v, c.p.Err("fence_value", f, st)
}

// FenceSignal calls fence_signal.
func (c *PluginCalls) FenceSignal(f, value uint64) error {
	return c.p.Err("fence_signal", f, c.p.FenceSignal(f, value))
}

// FenceRelease calls fence_release.
func (c *PluginCalls) FenceRelease(f uint64) error {
	return c.p.Err("fence_release", f, c.p.FenceRelease(f))
}
