package abi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/xpuhub/xpu/core"
)

// The core.Backend adapter: devices, contexts, buffers, executables, executions and fences over
// Calls, the same for a plugin in this process and one in a child process. It owns what the
// ABI leaves to the host: argument and lifecycle checks, the per-context constant cache, the
// count of live objects that keeps a context from closing under them, Analyze before Prepare,
// and the naming of nodes in plugin errors.

// NewDevice presents device idx of a plugin as a core.Device. calls gives the plugin's current
// Calls (an isolated backend's change when it restarts); each context keeps the Calls it was
// made with, so that objects of a replaced child keep failing as that child did.
func NewDevice(calls func() (Calls, error), idx uint32, info core.DeviceInfo) core.Device {
	return &device{calls: calls, idx: idx, info: info}
}

type device struct {
	calls func() (Calls, error)
	idx   uint32
	info  core.DeviceInfo
}

func (d *device) Info() core.DeviceInfo { return d.info }

func (d *device) OpSupport(q core.OpQuery) core.Verdict {
	calls, err := d.calls()
	if err != nil {
		return core.VerdictNo
	}
	v, err := calls.OpSupport(d.idx, q)
	if err != nil || v > core.VerdictMaybe {
		return core.VerdictNo
	}
	return v
}

func (d *device) NewContext(ctx context.Context, options map[string]string) (core.Context, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	opts, err := EncodeOptions(options)
	if err != nil {
		return nil, fmt.Errorf("%s: new context: %w", d.info.ID(), err)
	}
	calls, err := d.calls()
	if err != nil {
		return nil, err
	}
	h, err := calls.ContextCreate(ctx, d.idx, opts)
	if err != nil {
		return nil, err
	}
	return &devContext{d: d, calls: calls, h: h, consts: map[constKey]*constBuf{}}, nil
}

// constKey identifies a constant's bytes by their backing array: graphs built from the same
// weight slice share one device copy per context.
type constKey struct {
	ptr unsafe.Pointer
	n   int
}

type constBuf struct {
	h    uint64
	data []byte // keeps the Go memory (and so the key's address) alive while the copy lives
}

type devContext struct {
	d     *device
	calls Calls
	h     uint64

	mu     sync.Mutex
	consts map[constKey]*constBuf
	live   int // buffers, executables and fences made by the user and not yet closed
	closed bool
}

func (c *devContext) Device() core.Device { return c.d }

func (c *devContext) adjust(delta int) {
	c.mu.Lock()
	c.live += delta
	c.mu.Unlock()
}

func (c *devContext) check() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("%s: context is closed: %w", c.d.info.ID(), core.ErrBadState)
	}
	return nil
}

// made counts a new buffer of handle h (err nil) as live.
func (c *devContext) made(h uint64, size int64, keep []byte, err error) (core.Buffer, error) {
	if err != nil {
		return nil, err
	}
	c.adjust(1)
	return &buffer{c: c, h: h, size: size, keep: keep}, nil
}

func (c *devContext) Alloc(size int64, kind core.BufferKind) (core.Buffer, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("%s: alloc %d bytes: %w", c.d.info.ID(), size, core.ErrInvalidArgument)
	}
	h, err := c.calls.BufferAlloc(c.h, uint64(size), kind)
	return c.made(h, size, nil, err)
}

func (c *devContext) Import(mem []byte) (core.Buffer, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if !c.d.info.Caps.Has(core.CapImportHost) {
		return nil, fmt.Errorf("%s: import of host memory (the device cannot import it: use Alloc or ImportFD): %w",
			c.d.info.ID(), core.ErrUnsupported)
	}
	if len(mem) == 0 {
		return nil, fmt.Errorf("%s: import of 0 bytes: %w", c.d.info.ID(), core.ErrInvalidArgument)
	}
	h, err := c.calls.BufferImportHost(c.h, mem)
	return c.made(h, int64(len(mem)), mem, err)
}

func (c *devContext) ImportFD(fd int, offset, size int64) (core.Buffer, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if !c.d.info.Caps.Has(core.CapImportFD) {
		return nil, fmt.Errorf("%s: import of an fd: %w", c.d.info.ID(), core.ErrUnsupported)
	}
	if fd < 0 || offset < 0 || size <= 0 {
		return nil, fmt.Errorf("%s: import fd %d [%d,+%d): %w", c.d.info.ID(), fd, offset, size,
			core.ErrInvalidArgument)
	}
	h, err := c.calls.BufferImportFD(c.h, fd, uint64(offset), uint64(size))
	return c.made(h, size, nil, err)
}

// constRef uploads t's bytes once per context (c.mu held). Where the device imports host
// memory, mmap'd weights are imported in place; otherwise they are written to a device buffer
// (for an isolated device, one copy into memory shared with the child).
func (c *devContext) constRef(t *core.Tensor) (ConstRef, error) {
	if int64(len(t.Data)) != t.Bytes() {
		return ConstRef{}, fmt.Errorf("has %d bytes, its shape needs %d: %w", len(t.Data), t.Bytes(),
			core.ErrInvalidArgument)
	}
	if len(t.Data) == 0 {
		// an empty constant has no bytes to point at: any live buffer of the context will do
		for _, cb := range c.consts {
			return ConstRef{Buffer: cb.h}, nil
		}
	}
	key := constKey{ptr: unsafe.Pointer(unsafe.SliceData(t.Data)), n: len(t.Data)}
	if cb, ok := c.consts[key]; ok {
		return ConstRef{Buffer: cb.h}, nil
	}
	if ref, ok := c.containing(t.Data); ok {
		return ref, nil
	}
	var h uint64
	err := core.ErrUnsupported
	if c.d.info.Caps.Has(core.CapImportHost) && len(t.Data) > 0 && isFileBacked(t.Data) {
		// mmap'd weights (a GGUF file) neither move nor get freed while referenced: zero-copy
		h, err = c.calls.BufferImportHost(c.h, t.Data)
	}
	if err != nil {
		if h, err = c.calls.BufferAlloc(c.h, uint64(max(len(t.Data), 1)), core.BufferDevice); err != nil {
			return ConstRef{}, err
		}
		if err = c.calls.BufferWrite(h, 0, t.Data); err != nil {
			_ = c.calls.BufferRelease(h) // the write's error says what went wrong
			return ConstRef{}, err
		}
	}
	c.consts[key] = &constBuf{h: h, data: t.Data}
	return ConstRef{Buffer: h}, nil
}

// containing finds an uploaded constant whose bytes hold data (a row range of a weight
// uploaded whole, or more widely, before) and refers to data inside it (c.mu held): one device
// copy then serves every range, and a backend that keeps a derived copy of a weight (neon's
// repacked layout) can tell that the ranges are rows of one weight. Split parts whose cut moves
// at run time prepare their widest range first for this (sched's adaptive rows split).
func (c *devContext) containing(data []byte) (ConstRef, bool) {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	for _, cb := range c.consts {
		base := uintptr(unsafe.Pointer(unsafe.SliceData(cb.data)))
		if p >= base && p+uintptr(len(data)) <= base+uintptr(len(cb.data)) {
			return ConstRef{Buffer: cb.h, Offset: uint64(p - base)}, true
		}
	}
	return ConstRef{}, false
}

// encode writes g's IR, uploading constants first.
func (c *devContext) encode(g *core.Graph) ([]byte, error) {
	if g == nil {
		return nil, fmt.Errorf("nil graph: %w", core.ErrInvalidArgument)
	}
	if err := g.Validate(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("%s: context is closed: %w", c.d.info.ID(), core.ErrBadState)
	}
	return EncodeGraph(g, c.constRef)
}

func (c *devContext) analyze(ctx context.Context, g *core.Graph, ir []byte) ([]core.NodeVerdict, error) {
	raw, err := c.calls.GraphAnalyze(ctx, c.h, ir, uint32(len(g.Nodes)))
	if err != nil {
		return nil, err
	}
	if len(raw) != len(g.Nodes) {
		return nil, fmt.Errorf("%s: graph_analyze: %d verdicts for %d nodes: %w", c.d.info.ID(), len(raw),
			len(g.Nodes), core.ErrInternal)
	}
	return NodeVerdicts(raw), nil
}

func (c *devContext) Analyze(ctx context.Context, g *core.Graph) ([]core.NodeVerdict, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ir, err := c.encode(g)
	if err != nil {
		return nil, fmt.Errorf("%s: analyze: %w", c.d.info.ID(), err)
	}
	return c.analyze(ctx, g, ir)
}

func (c *devContext) Prepare(ctx context.Context, g *core.Graph, opts ...core.PrepareOption) (core.Executable, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	id := c.d.info.ID()
	cfg := core.NewPrepareConfig(opts...)
	popts, err := EncodeOptions(cfg.Options)
	if err != nil {
		return nil, fmt.Errorf("%s: prepare: %w", id, err)
	}
	ir, err := c.encode(g)
	if err != nil {
		return nil, fmt.Errorf("%s: prepare: %w", id, err)
	}
	// a plugin without graph_analyze (it answers UNSUPPORTED) is asked to prepare directly
	verdicts, err := c.analyze(ctx, g, ir)
	if err != nil && !errors.Is(err, core.ErrUnsupported) {
		return nil, fmt.Errorf("%s: prepare: %w", id, err)
	}
	if err := Refused(id, g, verdicts); err != nil {
		return nil, err
	}
	h, err := c.calls.GraphPrepare(ctx, c.h, ir, popts, cfg.Cache)
	if err != nil {
		if se := (*StatusError)(nil); errors.As(err, &se) {
			se.Msg = NameNodes(g, se.Msg)
		}
		return nil, fmt.Errorf("%s: prepare: %w", id, err)
	}
	if v, ok := c.calls.(*Validator); ok {
		v.notePrepared(h, g) // the validation layer compares the first run with the reference
	}
	c.adjust(1)
	return &executable{c: c, h: h, g: g, verdicts: verdicts}, nil
}

func (c *devContext) NewFence(initial uint64) (core.Fence, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	h, err := c.calls.FenceCreate(c.h, initial)
	if err != nil {
		return nil, err
	}
	c.adjust(1)
	return &fence{c: c, h: h}, nil
}

func (c *devContext) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	if c.live > 0 {
		return fmt.Errorf("%s: close context: %d buffers, executables or fences are still open: %w",
			c.d.info.ID(), c.live, core.ErrBadState)
	}
	var errs []error
	for k, cb := range c.consts {
		if err := c.calls.BufferRelease(cb.h); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(c.consts, k)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := c.calls.ContextRelease(c.h); err != nil {
		return err
	}
	c.closed = true
	return nil
}

type buffer struct {
	c    *devContext
	h    uint64
	size int64
	keep []byte // imported host memory: referenced so the GC keeps it while the plugin uses it

	mu     sync.Mutex
	closed bool
}

func (b *buffer) Size() int64 { return b.size }

func (b *buffer) rangeErr(what string, offset int64, n int) error {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return fmt.Errorf("%s: buffer is closed: %w", what, core.ErrBadState)
	}
	if offset < 0 || offset > b.size || int64(n) > b.size-offset {
		return fmt.Errorf("%s [%d,+%d) outside a %d-byte buffer: %w", what, offset, n, b.size,
			core.ErrInvalidArgument)
	}
	return nil
}

func (b *buffer) Write(offset int64, src []byte) error {
	if err := b.rangeErr("write", offset, len(src)); err != nil {
		return err
	}
	if len(src) == 0 {
		return nil
	}
	return b.c.calls.BufferWrite(b.h, uint64(offset), src)
}

func (b *buffer) Read(offset int64, dst []byte) error {
	if err := b.rangeErr("read", offset, len(dst)); err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	return b.c.calls.BufferRead(b.h, uint64(offset), dst)
}

func (b *buffer) Map() ([]byte, error) {
	if err := b.rangeErr("map", 0, 0); err != nil {
		return nil, err
	}
	m, err := b.c.calls.BufferMap(b.h)
	if err != nil {
		return nil, err
	}
	if int64(len(m)) > b.size {
		m = m[:b.size]
	}
	return m, nil
}

func (b *buffer) Unmap() error { return b.c.calls.BufferUnmap(b.h) }

func (b *buffer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	if err := b.c.calls.BufferRelease(b.h); err != nil {
		return err
	}
	b.closed = true
	b.keep = nil
	b.c.adjust(-1)
	return nil
}

type executable struct {
	c        *devContext
	h        uint64
	g        *core.Graph
	verdicts []core.NodeVerdict
	hist     RunHistory

	mu     sync.Mutex
	closed bool
}

func (e *executable) NewExecution() (core.Execution, error) {
	h, err := e.c.calls.ExecutionCreate(e.h)
	if err != nil {
		return nil, err
	}
	return &execution{e: e, h: h, binds: make([]*buffer, len(e.g.Inputs)+len(e.g.Outputs))}, nil
}

func (e *executable) Serialize() ([]byte, error) { return e.c.calls.ExecutableSerialize(e.h) }

func (e *executable) Verdicts() []core.NodeVerdict {
	return append([]core.NodeVerdict(nil), e.verdicts...)
}

func (e *executable) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	if err := e.c.calls.ExecutableRelease(e.h); err != nil {
		return err
	}
	e.closed = true
	e.c.adjust(-1)
	return nil
}

type execution struct {
	e *executable
	h uint64

	mu    sync.Mutex
	binds []*buffer // keeps bound buffers (and imported memory) reachable
}

func (x *execution) Bind(io int, buf core.Buffer, offset int64) error {
	b, ok := buf.(*buffer)
	if !ok || b.c != x.e.c {
		return fmt.Errorf("bind io %d: the buffer is not of this executable's context: %w", io,
			core.ErrInvalidArgument)
	}
	t, err := x.e.g.Binding(io)
	if err != nil {
		return fmt.Errorf("bind %w", err)
	}
	// the tensor is named only on failure: Bind is on the decode loop (the KV rows move)
	if err := b.rangeErr("bind", offset, int(t.Bytes())); err != nil {
		return fmt.Errorf("io %d (%s): %w", io, t, err)
	}
	if err := x.e.c.calls.ExecutionBind(x.h, uint32(io), b.h, uint64(offset)); err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.binds == nil {
		return fmt.Errorf("bind io %d: execution is closed: %w", io, core.ErrBadState)
	}
	x.binds[io] = b
	return nil
}

func (x *execution) Run(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return x.e.c.calls.ExecutionRun(ctx, x.h, &x.e.hist)
}

// fencePoint checks that fp's fence is of the same plugin (process) as the context.
func (c *devContext) fencePoint(fp core.FencePoint) (FencePoint, error) {
	f, ok := fp.Fence.(*fence)
	if !ok || f.c.calls != c.calls {
		return FencePoint{}, fmt.Errorf("fence is not of this backend: %w", core.ErrInvalidArgument)
	}
	return FencePoint{Fence: f.h, Value: fp.Value}, nil
}

func (x *execution) Submit(waits []core.FencePoint, signal *core.FencePoint) error {
	ws := make([]FencePoint, len(waits))
	for i, w := range waits {
		fp, err := x.e.c.fencePoint(w)
		if err != nil {
			return fmt.Errorf("submit: wait %d: %w", i, err)
		}
		ws[i] = fp
	}
	var sig *FencePoint
	if signal != nil {
		fp, err := x.e.c.fencePoint(*signal)
		if err != nil {
			return fmt.Errorf("submit: signal: %w", err)
		}
		sig = &fp
	}
	return x.e.c.calls.ExecutionSubmit(x.h, ws, sig)
}

func (x *execution) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.binds == nil {
		return nil
	}
	if err := x.e.c.calls.ExecutionRelease(x.h); err != nil {
		return err
	}
	x.binds = nil
	return nil
}

type fence struct {
	c *devContext
	h uint64

	mu     sync.Mutex
	closed bool
}

// Wait waits in slices (WaitSliced) so that a cancelled ctx is noticed promptly; a long wait is
// legitimate, so a slice that times out is repeated.
func (f *fence) Wait(ctx context.Context, value uint64) error {
	return WaitSliced(ctx, func(slice time.Duration) (bool, error) {
		err := f.c.calls.FenceWait(f.h, value, slice)
		if IsWaitTimeout(err) {
			return false, nil
		}
		return true, err
	})
}

func (f *fence) Value() (uint64, error) { return f.c.calls.FenceValue(f.h) }

func (f *fence) Signal(value uint64) error { return f.c.calls.FenceSignal(f.h, value) }

func (f *fence) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	if err := f.c.calls.FenceRelease(f.h); err != nil {
		return err
	}
	f.closed = true
	f.c.adjust(-1)
	return nil
}
