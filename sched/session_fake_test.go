package sched_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xpuhub/xpu/core"
)

// fakeDevice is a test device that runs ADD, MUL, SCALE and SILU on f32, for only the ops it
// is given. It counts what sessions do with it.
type fakeDevice struct {
	backend    string
	index      int
	kind       core.DeviceKind
	caps       core.Caps
	ops        map[core.Op]bool
	analyzeErr error         // Analyze fails with it
	delay      time.Duration // every execution takes this long (cancellable)
	// rendezvous, when set, makes an execution wait until another device's execution has
	// started too: it proves two partitions overlap.
	rendezvous *rendezvous
	// openRendezvous does the same for NewContext: it proves devices open in parallel.
	openRendezvous *rendezvous
	openErr        error // NewContext fails with it

	contexts, liveContexts, prepares, liveExes, runs, allocs atomic.Int32
	lastOptions                                              atomic.Value // map[string]string

	openMu sync.Mutex
	open   map[*fakeContext]map[string]string // the options of every context not yet closed
}

// liveOptions is the options of every context not yet closed.
func (d *fakeDevice) liveOptions() []map[string]string {
	d.openMu.Lock()
	defer d.openMu.Unlock()
	return slices.Collect(maps.Values(d.open))
}

func newFake(backend string, kind core.DeviceKind, ops ...core.Op) *fakeDevice {
	d := &fakeDevice{backend: backend, kind: kind, ops: map[core.Op]bool{}}
	for _, o := range ops {
		d.ops[o] = true
	}
	return d
}

var allFakeOps = []core.Op{core.OpAdd, core.OpMul, core.OpScale, core.OpSiLU}

func (d *fakeDevice) Info() core.DeviceInfo {
	return core.DeviceInfo{Backend: d.backend, Index: d.index, Kind: d.kind, Caps: d.caps, Name: "fake " + d.backend}
}

func (d *fakeDevice) OpSupport(q core.OpQuery) core.Verdict {
	if d.ops[q.Op] && q.DTypeIn == core.F32 {
		return core.VerdictYes
	}
	return core.VerdictNo
}

func (d *fakeDevice) NewContext(ctx context.Context, options map[string]string) (core.Context, error) {
	if d.openRendezvous != nil {
		if err := d.openRendezvous.meet(ctx); err != nil {
			return nil, err
		}
	}
	if d.openErr != nil {
		return nil, d.openErr
	}
	d.contexts.Add(1)
	d.liveContexts.Add(1)
	d.lastOptions.Store(options)
	c := &fakeContext{dev: d}
	d.openMu.Lock()
	if d.open == nil {
		d.open = map[*fakeContext]map[string]string{}
	}
	d.open[c] = maps.Clone(options)
	d.openMu.Unlock()
	return c, nil
}

// rendezvous lets n executions wait for each other.
type rendezvous struct {
	mu      sync.Mutex
	n       int
	arrived int
	all     chan struct{}
}

func newRendezvous(n int) *rendezvous { return &rendezvous{n: n, all: make(chan struct{})} }

func (r *rendezvous) meet(ctx context.Context) error {
	r.mu.Lock()
	r.arrived++
	if r.arrived == r.n {
		close(r.all)
	}
	r.mu.Unlock()
	select {
	case <-r.all:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(10 * time.Second):
		return fmt.Errorf("rendezvous: executions did not overlap")
	}
}

type fakeContext struct {
	dev    *fakeDevice
	mu     sync.Mutex
	live   int // buffers and executables not yet closed
	closed bool
}

func (c *fakeContext) Device() core.Device { return c.dev }

func (c *fakeContext) Alloc(size int64, _ core.BufferKind) (core.Buffer, error) {
	if size < 0 {
		return nil, fmt.Errorf("fake: alloc %d: %w", size, core.ErrInvalidArgument)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("fake: alloc on a closed context: %w", core.ErrBadState)
	}
	c.live++
	c.dev.allocs.Add(1)
	return &fakeBuffer{ctx: c, data: make([]byte, size)}, nil
}

func (c *fakeContext) Import([]byte) (core.Buffer, error) {
	return nil, fmt.Errorf("fake: import: %w", core.ErrUnsupported)
}

func (c *fakeContext) ImportFD(int, int64, int64) (core.Buffer, error) {
	return nil, fmt.Errorf("fake: import fd: %w", core.ErrUnsupported)
}

func (c *fakeContext) Analyze(_ context.Context, g *core.Graph) ([]core.NodeVerdict, error) {
	if c.dev.analyzeErr != nil {
		return nil, c.dev.analyzeErr
	}
	out := make([]core.NodeVerdict, len(g.Nodes))
	for i, n := range g.Nodes {
		switch {
		case !c.dev.ops[n.Op]:
			out[i].Reason = fmt.Sprintf("%s is not implemented", n.Op)
		case n.Output.DType != core.F32:
			out[i].Reason = "f32 only"
		case n.Op.Binary() && n.Inputs[0].Shape.NumElements()%max(n.Inputs[1].Shape.NumElements(), 1) != 0:
			out[i].Reason = "only suffix broadcasting"
		default:
			out[i] = core.NodeVerdict{Supported: true, Precision: core.PrecF32}
		}
	}
	return out, nil
}

func (c *fakeContext) Prepare(ctx context.Context, g *core.Graph, _ ...core.PrepareOption) (core.Executable, error) {
	vs, err := c.Analyze(ctx, g)
	if err != nil {
		return nil, err
	}
	for i, v := range vs {
		if !v.Supported {
			return nil, fmt.Errorf("fake: %s: %s: %w", g.Nodes[i], v.Reason, core.ErrUnsupported)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("fake: prepare on a closed context: %w", core.ErrBadState)
	}
	c.live++
	c.dev.prepares.Add(1)
	c.dev.liveExes.Add(1)
	return &fakeExe{ctx: c, g: g, verdicts: vs}, nil
}

func (c *fakeContext) NewFence(uint64) (core.Fence, error) {
	return nil, fmt.Errorf("fake: fences: %w", core.ErrUnsupported)
}

func (c *fakeContext) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("fake: context closed twice: %w", core.ErrBadState)
	}
	if c.live > 0 {
		return fmt.Errorf("fake: %d objects still alive: %w", c.live, core.ErrBadState)
	}
	c.closed = true
	c.dev.liveContexts.Add(-1)
	c.dev.openMu.Lock()
	delete(c.dev.open, c)
	c.dev.openMu.Unlock()
	return nil
}

func (c *fakeContext) release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live == 0 {
		return fmt.Errorf("fake: released more than allocated: %w", core.ErrBadState)
	}
	c.live--
	return nil
}

type fakeBuffer struct {
	ctx    *fakeContext
	mu     sync.Mutex
	data   []byte
	closed bool
}

func (b *fakeBuffer) Size() int64 { return int64(len(b.data)) }

func (b *fakeBuffer) span(offset int64, n int) error {
	if b.closed {
		return fmt.Errorf("fake: buffer closed: %w", core.ErrInvalidHandle)
	}
	if offset < 0 || offset+int64(n) > int64(len(b.data)) {
		return fmt.Errorf("fake: %d bytes at %d outside %d: %w", n, offset, len(b.data), core.ErrInvalidArgument)
	}
	return nil
}

func (b *fakeBuffer) Write(offset int64, src []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.span(offset, len(src)); err != nil {
		return err
	}
	copy(b.data[offset:], src)
	return nil
}

func (b *fakeBuffer) Read(offset int64, dst []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.span(offset, len(dst)); err != nil {
		return err
	}
	copy(dst, b.data[offset:])
	return nil
}

func (b *fakeBuffer) Map() ([]byte, error) {
	return nil, fmt.Errorf("fake: map: %w", core.ErrUnsupported)
}

func (b *fakeBuffer) Unmap() error { return fmt.Errorf("fake: unmap: %w", core.ErrUnsupported) }

func (b *fakeBuffer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("fake: buffer closed twice: %w", core.ErrInvalidHandle)
	}
	b.closed = true
	return b.ctx.release()
}

type fakeExe struct {
	ctx      *fakeContext
	g        *core.Graph
	verdicts []core.NodeVerdict
	closed   atomic.Bool
}

func (e *fakeExe) NewExecution() (core.Execution, error) {
	if e.closed.Load() {
		return nil, fmt.Errorf("fake: executable closed: %w", core.ErrInvalidHandle)
	}
	e.ctx.mu.Lock()
	e.ctx.live++
	e.ctx.mu.Unlock()
	n := len(e.g.Inputs) + len(e.g.Outputs)
	return &fakeExecution{exe: e, binds: make([]core.Buffer, n), offs: make([]int64, n)}, nil
}

func (e *fakeExe) Serialize() ([]byte, error) {
	return nil, fmt.Errorf("fake: serialize: %w", core.ErrUnsupported)
}

func (e *fakeExe) Verdicts() []core.NodeVerdict { return e.verdicts }

func (e *fakeExe) Close() error {
	if e.closed.Swap(true) {
		return fmt.Errorf("fake: executable closed twice: %w", core.ErrInvalidHandle)
	}
	e.ctx.dev.liveExes.Add(-1)
	return e.ctx.release()
}

type fakeExecution struct {
	exe   *fakeExe
	mu    sync.Mutex
	binds []core.Buffer
	offs  []int64
	busy  atomic.Bool
}

func (x *fakeExecution) Bind(io int, buf core.Buffer, offset int64) error {
	if io < 0 || io >= len(x.binds) || offset < 0 {
		return fmt.Errorf("fake: bind %d at %d: %w", io, offset, core.ErrInvalidArgument)
	}
	if _, ok := buf.(*fakeBuffer); !ok {
		return fmt.Errorf("fake: bind %d: a foreign buffer: %w", io, core.ErrInvalidArgument)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.binds[io], x.offs[io] = buf, offset
	return nil
}

func (x *fakeExecution) Run(ctx context.Context) error {
	if x.busy.Swap(true) {
		return fmt.Errorf("fake: execution already running: %w", core.ErrBadState)
	}
	defer x.busy.Store(false)
	x.mu.Lock()
	defer x.mu.Unlock()
	d := x.exe.ctx.dev
	d.runs.Add(1)
	if d.rendezvous != nil {
		if err := d.rendezvous.meet(ctx); err != nil {
			return err
		}
	}
	if d.delay > 0 {
		select {
		case <-time.After(d.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	g := x.exe.g
	vals := map[*core.Tensor][]float32{}
	for i, t := range g.Inputs {
		if x.binds[i] == nil {
			return fmt.Errorf("fake: input %d unbound: %w", i, core.ErrBadState)
		}
		b := make([]byte, t.Bytes())
		if err := x.binds[i].Read(x.offs[i], b); err != nil {
			return err
		}
		vals[t] = core.DecodeF32(b)
	}
	get := func(t *core.Tensor) []float32 {
		if t.Kind == core.KindConst {
			return core.DecodeF32(t.Data)
		}
		return vals[t]
	}
	for _, n := range g.Nodes {
		a := get(n.Inputs[0])
		out := make([]float32, len(a))
		for i, v := range a {
			switch n.Op {
			case core.OpAdd:
				b := get(n.Inputs[1])
				out[i] = v + b[i%len(b)]
			case core.OpMul:
				b := get(n.Inputs[1])
				out[i] = v * b[i%len(b)]
			case core.OpScale:
				out[i] = v*n.FAttr[0] + n.FAttr[1]
			case core.OpSiLU:
				out[i] = v / (1 + float32(math.Exp(-float64(v))))
			}
		}
		vals[n.Output] = out
	}
	for j, t := range g.Outputs {
		io := len(g.Inputs) + j
		if x.binds[io] == nil {
			return fmt.Errorf("fake: output %d unbound: %w", j, core.ErrBadState)
		}
		if err := x.binds[io].Write(x.offs[io], core.EncodeF32(vals[t])); err != nil {
			return err
		}
	}
	return nil
}

func (x *fakeExecution) Submit([]core.FencePoint, *core.FencePoint) error {
	return fmt.Errorf("fake: submit: %w", core.ErrUnsupported)
}

func (x *fakeExecution) Close() error { return x.exe.ctx.release() }
