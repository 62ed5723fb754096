package abi

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/xpuhub/xpu/core"
)

// NewBackend presents an opened plugin as a core.Backend (its Score is the plugin's probe
// score). Closing the backend closes the plugin.
func NewBackend(p *Plugin) (core.Backend, error) {
	b := &backend{p: p}
	pi := p.Info()
	b.info = core.BackendInfo{Name: p.probe.Name, Vendor: pi.Vendor, Version: pi.Version,
		BuildID: pi.BuildID, SDKVersion: pi.SDKVersion, Path: p.Path(), Score: p.probe.Score}
	n, st := p.DeviceCount()
	if st != StatusOK {
		return nil, fmt.Errorf("%s: device_count: %w", b.info.Name, st.Err(p.LastError(0)))
	}
	if n > 1024 {
		return nil, fmt.Errorf("%s: device_count says %d devices: %w", b.info.Name, n, core.ErrInternal)
	}
	for i := range n {
		di, st := p.DeviceInfo(i)
		if st != StatusOK {
			return nil, fmt.Errorf("%s: device_info(%d): %w", b.info.Name, i, st.Err(p.LastError(0)))
		}
		b.devs = append(b.devs, &device{b: b, idx: i, info: di})
	}
	return b, nil
}

type backend struct {
	p    *Plugin
	info core.BackendInfo
	devs []core.Device
}

func (b *backend) Info() core.BackendInfo { return b.info }

func (b *backend) Devices() []core.Device { return append([]core.Device(nil), b.devs...) }

func (b *backend) Close() error { return b.p.Close() }

// Plugin returns the raw plugin under a backend made by NewBackend (for the conformance suite's
// ABI tests), or nil for any other backend.
func PluginOf(be core.Backend) *Plugin {
	if b, ok := be.(*backend); ok {
		return b.p
	}
	return nil
}

func (b *backend) err(op string, h uint64, st Status) error { return b.p.Err(op, h, st) }

type device struct {
	b    *backend
	idx  uint32
	info core.DeviceInfo
}

func (d *device) Info() core.DeviceInfo { return d.info }

func (d *device) OpSupport(q core.OpQuery) core.Verdict {
	v, st := d.b.p.OpSupport(d.idx, q)
	if st != StatusOK || v > core.VerdictMaybe {
		return core.VerdictNo
	}
	return v
}

// EncodeOptions writes options as "k=v;k=v" in key order, refusing the separators inside keys
// and values (they would change the meaning of the string the plugin parses). It is the one
// encoding of context and prepare options, in process and isolated.
func EncodeOptions(opts map[string]string) (string, error) {
	keys := make([]string, 0, len(opts))
	for k, v := range opts {
		if k == "" || strings.ContainsAny(k, "=;\x00") || strings.ContainsAny(v, ";\x00") {
			return "", fmt.Errorf("option %q=%q: keys need no '=' or ';', values no ';': %w", k, v,
				core.ErrInvalidArgument)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + opts[k]
	}
	return strings.Join(parts, ";"), nil
}

func (d *device) NewContext(ctx context.Context, options map[string]string) (core.Context, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	opts, err := EncodeOptions(options)
	if err != nil {
		return nil, fmt.Errorf("%s: new context: %w", d.info.ID(), err)
	}
	h, st := d.b.p.ContextCreate(d.idx, opts)
	if st != StatusOK {
		return nil, d.b.err("context_create", 0, st)
	}
	return &devContext{d: d, h: h, consts: map[constKey]*constBuf{}}, nil
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
	d *device
	h uint64

	mu     sync.Mutex
	consts map[constKey]*constBuf
	live   int // buffers, executables and fences made by the user and not yet closed
	closed bool
}

func (c *devContext) p() *Plugin { return c.d.b.p }

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

func (c *devContext) Alloc(size int64, kind core.BufferKind) (core.Buffer, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("%s: alloc %d bytes: %w", c.d.info.ID(), size, core.ErrInvalidArgument)
	}
	h, st := c.p().BufferAlloc(c.h, uint64(size), uint32(kind))
	if st != StatusOK {
		return nil, c.d.b.err("buffer_alloc", c.h, st)
	}
	c.adjust(1)
	return &buffer{c: c, h: h, size: size}, nil
}

func (c *devContext) Import(mem []byte) (core.Buffer, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if !c.d.info.Caps.Has(core.CapImportHost) {
		return nil, fmt.Errorf("%s: import of host memory: %w", c.d.info.ID(), core.ErrUnsupported)
	}
	if len(mem) == 0 {
		return nil, fmt.Errorf("%s: import of 0 bytes: %w", c.d.info.ID(), core.ErrInvalidArgument)
	}
	h, st := c.p().BufferImportHost(c.h, mem)
	if st != StatusOK {
		return nil, c.d.b.err("buffer_import", c.h, st)
	}
	c.adjust(1)
	return &buffer{c: c, h: h, size: int64(len(mem)), keep: mem}, nil
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
	h, st := c.p().BufferImportFD(c.h, fd, uint64(offset), uint64(size))
	if st != StatusOK {
		return nil, c.d.b.err("buffer_import", c.h, st)
	}
	c.adjust(1)
	return &buffer{c: c, h: h, size: size}, nil
}

// constRef uploads t's bytes once per context (c.mu held).
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
	size := uint64(max(len(t.Data), 1))
	var h uint64
	st := StatusUnsupported
	if c.d.info.Caps.Has(core.CapImportHost) && len(t.Data) > 0 && isFileBacked(t.Data) {
		// mmap'd weights (a GGUF file) neither move nor get freed while referenced: zero-copy
		h, st = c.p().BufferImportHost(c.h, t.Data)
	}
	if st != StatusOK {
		h, st = c.p().BufferAlloc(c.h, size, uint32(core.BufferDevice))
		if st != StatusOK {
			return ConstRef{}, c.d.b.err("buffer_alloc", c.h, st)
		}
		if st = c.p().BufferWrite(h, 0, t.Data); st != StatusOK {
			err := c.d.b.err("buffer_write", h, st)
			c.p().BufferRelease(h)
			return ConstRef{}, err
		}
	}
	c.consts[key] = &constBuf{h: h, data: t.Data}
	return ConstRef{Buffer: h}, nil
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

func (c *devContext) analyze(g *core.Graph, ir []byte) ([]core.NodeVerdict, error) {
	raw, st := c.p().GraphAnalyze(c.h, ir, uint32(len(g.Nodes)))
	if st != StatusOK {
		return nil, c.d.b.err("graph_analyze", c.h, st)
	}
	return NodeVerdicts(raw), nil
}

// NodeVerdicts turns a plugin's graph_analyze answer into core verdicts (a refusal without a
// reason gets one), in process and isolated alike.
func NodeVerdicts(raw []RawVerdict) []core.NodeVerdict {
	vs := make([]core.NodeVerdict, len(raw))
	for i, v := range raw {
		vs[i] = core.NodeVerdict{Supported: v.Verdict == core.VerdictYes, Precision: v.Precision,
			Reason: v.Reason}
		if !vs[i].Supported && vs[i].Reason == "" {
			vs[i].Reason = "refused without a reason"
		}
	}
	return vs
}

// Refused is the error of a prepare whose graph has nodes the plugin's analysis refused (each
// named with its reason, wrapping core.ErrUnsupported), or nil when it refused none.
func Refused(id string, g *core.Graph, verdicts []core.NodeVerdict) error {
	var refused []string
	for i, v := range verdicts {
		if !v.Supported {
			refused = append(refused, fmt.Sprintf("%s: %s", g.Nodes[i], v.Reason))
		}
	}
	if len(refused) == 0 {
		return nil
	}
	return fmt.Errorf("%s: prepare: %s: %w", id, strings.Join(refused, "; "), core.ErrUnsupported)
}

func (c *devContext) Analyze(ctx context.Context, g *core.Graph) ([]core.NodeVerdict, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ir, err := c.encode(g)
	if err != nil {
		return nil, fmt.Errorf("%s: analyze: %w", c.d.info.ID(), err)
	}
	return c.analyze(g, ir)
}

var nodeIndexRE = regexp.MustCompile(`\bnode (\d+)`)

// NameNodes appends the graph's node names to the node indices a plugin's message mentions
// ("node 3" becomes `node 3 "blk.0.attn_q"`), so that errors name the node the user built.
func NameNodes(g *core.Graph, msg string) string {
	return nodeIndexRE.ReplaceAllStringFunc(msg, func(m string) string {
		i, err := strconv.Atoi(nodeIndexRE.FindStringSubmatch(m)[1])
		if err != nil || i < 0 || i >= len(g.Nodes) {
			return m
		}
		return fmt.Sprintf("%s %q", m, g.Nodes[i].Name)
	})
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
	var verdicts []core.NodeVerdict
	if c.p().HasEntry("graph_analyze") {
		if verdicts, err = c.analyze(g, ir); err != nil {
			return nil, fmt.Errorf("%s: prepare: %w", id, err)
		}
		if err := Refused(id, g, verdicts); err != nil {
			return nil, err
		}
	}
	h, st := c.p().GraphPrepare(c.h, ir, popts, cfg.Cache)
	if st != StatusOK {
		return nil, fmt.Errorf("%s: prepare: %w", id, st.Err(NameNodes(g, c.p().LastError(c.h))))
	}
	c.adjust(1)
	return &executable{c: c, h: h, g: g, verdicts: verdicts}, nil
}

func (c *devContext) NewFence(initial uint64) (core.Fence, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	h, st := c.p().FenceCreate(c.h, initial)
	if st != StatusOK {
		return nil, c.d.b.err("fence_create", c.h, st)
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
		if st := c.p().BufferRelease(cb.h); st != StatusOK {
			errs = append(errs, c.d.b.err("buffer_release", cb.h, st))
			continue
		}
		delete(c.consts, k)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if st := c.p().ContextRelease(c.h); st != StatusOK {
		return c.d.b.err("context_release", c.h, st)
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
	return b.c.d.b.err("buffer_write", b.h, b.c.p().BufferWrite(b.h, uint64(offset), src))
}

func (b *buffer) Read(offset int64, dst []byte) error {
	if err := b.rangeErr("read", offset, len(dst)); err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	return b.c.d.b.err("buffer_read", b.h, b.c.p().BufferRead(b.h, uint64(offset), dst))
}

func (b *buffer) Map() ([]byte, error) {
	if err := b.rangeErr("map", 0, 0); err != nil {
		return nil, err
	}
	m, st := b.c.p().BufferMap(b.h)
	if st != StatusOK {
		return nil, b.c.d.b.err("buffer_map", b.h, st)
	}
	if int64(len(m)) > b.size {
		m = m[:b.size]
	}
	return m, nil
}

func (b *buffer) Unmap() error {
	return b.c.d.b.err("buffer_unmap", b.h, b.c.p().BufferUnmap(b.h))
}

func (b *buffer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	if st := b.c.p().BufferRelease(b.h); st != StatusOK {
		return b.c.d.b.err("buffer_release", b.h, st)
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

	mu     sync.Mutex
	closed bool
}

func (e *executable) NewExecution() (core.Execution, error) {
	h, st := e.c.p().ExecutionCreate(e.h)
	if st != StatusOK {
		return nil, e.c.d.b.err("execution_create", e.h, st)
	}
	return &execution{e: e, h: h, binds: make([]*buffer, len(e.g.Inputs)+len(e.g.Outputs))}, nil
}

func (e *executable) Serialize() ([]byte, error) {
	blob, st := e.c.p().ExecutableSerialize(e.h)
	if st != StatusOK {
		return nil, e.c.d.b.err("executable_serialize", e.h, st)
	}
	return blob, nil
}

func (e *executable) Verdicts() []core.NodeVerdict {
	return append([]core.NodeVerdict(nil), e.verdicts...)
}

func (e *executable) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	if st := e.c.p().ExecutableRelease(e.h); st != StatusOK {
		return e.c.d.b.err("executable_release", e.h, st)
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

func (x *execution) err(op string, st Status) error { return x.e.c.d.b.err(op, x.h, st) }

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
	if st := x.e.c.p().ExecutionBind(x.h, uint32(io), b.h, uint64(offset)); st != StatusOK {
		return x.err("execution_bind", st)
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
	if ctx.Done() == nil {
		// nothing can cancel it: no goroutine and channel per run on the decode loop
		return x.err("execution_run", x.e.c.p().ExecutionRun(x.h))
	}
	done := make(chan Status, 1)
	go func() { done <- x.e.c.p().ExecutionRun(x.h) }()
	select {
	case st := <-done:
		return x.err("execution_run", st)
	case <-ctx.Done():
		// the plugin call goes on; the execution answers BAD_STATE until it is over
		return fmt.Errorf("%s: run: %w", x.e.c.d.info.ID(), ctx.Err())
	}
}

func (c *devContext) fencePoint(fp core.FencePoint) (FencePoint, error) {
	f, ok := fp.Fence.(*fence)
	if !ok || f.c.d.b != c.d.b {
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
	return x.err("execution_submit", x.e.c.p().ExecutionSubmit(x.h, ws, sig))
}

func (x *execution) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.binds == nil {
		return nil
	}
	if st := x.e.c.p().ExecutionRelease(x.h); st != StatusOK {
		return x.err("execution_release", st)
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

// fenceSlice bounds each blocking fence_wait so that a cancelled ctx is noticed promptly
// without a goroutine per wait; a long wait is legitimate, so a timed-out slice is repeated.
const fenceSlice = 20 * time.Millisecond

// WaitSliced calls wait with slices of at most 20 ms (less where ctx's deadline is nearer)
// until wait reports done, returning its error, or ctx ends, returning ctx's error. It is how
// a fence_wait honours a context, in process and across the isolation boundary alike.
func WaitSliced(ctx context.Context, wait func(slice time.Duration) (done bool, err error)) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		slice := fenceSlice
		if dl, ok := ctx.Deadline(); ok {
			slice = min(slice, max(time.Until(dl), 0))
		}
		if done, err := wait(slice); done {
			return err
		}
	}
}

func (f *fence) Wait(ctx context.Context, value uint64) error {
	return WaitSliced(ctx, func(slice time.Duration) (bool, error) {
		st := f.c.p().FenceWait(f.h, value, slice)
		if st == StatusTimeout {
			return false, nil
		}
		return true, f.c.d.b.err("fence_wait", f.h, st)
	})
}

func (f *fence) Value() (uint64, error) {
	v, st := f.c.p().FenceValue(f.h)
	return v, f.c.d.b.err("fence_value", f.h, st)
}

func (f *fence) Signal(value uint64) error {
	return f.c.d.b.err("fence_signal", f.h, f.c.p().FenceSignal(f.h, value))
}

func (f *fence) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	if st := f.c.p().FenceRelease(f.h); st != StatusOK {
		return f.c.d.b.err("fence_release", f.h, st)
	}
	f.closed = true
	f.c.adjust(-1)
	return nil
}
