package sched

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/xpuhub/xpu/core"
)

// Executor runs sessions on one Runtime whose units it opens on first use, so that several
// sessions over the same weights share them: constants are uploaded once per context, and a
// graph prepared once (same unit, structure, shapes, attributes and constant slices) is taken
// from the runtime's cache instead of being prepared again. Units are identified by their name
// (UnitName with the executor's default options filled in: "neon:0", "neon:0{cpus=1}"), so two
// units of one device get two contexts; an executor serves one set of loaded backends. A unit
// joins the runtime (a worker of its own) when a session first places nodes on it; until then
// it is only open, for Analyze and Alloc. The arena is carved, never freed span by span: the
// spans of a closed session's programs and of closed Alloc buffers return to the system when
// the executor closes, so a long-lived executor suits a set of sessions made once, not one per
// request. An Executor is safe for concurrent use.
type Executor struct {
	cfg sessionConfig
	log *slog.Logger
	rt  *Runtime

	mu     sync.Mutex
	units  map[string]*execUnit // by unit name
	closed bool
}

// execUnit is one open (or opening) unit.
type execUnit struct {
	name string
	// ready is closed once the unit is open (unit) or failed to open (err); the first caller
	// opens it outside the executor's lock, so units open in parallel.
	ready chan struct{}
	unit  *Unit
	err   error
	idx   int // the unit's index in the runtime once a session placed nodes on it; -1 before
}

// NewExecutor makes an executor. Of the session options, WithContextOptions (default options
// for every unit it opens), WithLogger, WithCacheSize and WithTrace (every session's runs) apply;
// the others are per session.
func NewExecutor(opts ...SessionOption) *Executor {
	cfg := newSessionConfig(opts)
	rt := newRuntime(newRuntimeConfig([]RuntimeOption{WithRuntimeLogger(cfg.logger),
		WithRuntimeCacheSize(cfg.cacheSize), WithRuntimeTrace(cfg.trace)}))
	return &Executor{cfg: cfg, log: cfg.logger, rt: rt, units: map[string]*execUnit{}}
}

// errClosed is returned by calls on a closed Executor or Session.
var errClosed = fmt.Errorf("closed: %w", core.ErrBadState)

// unitSpec is the spec of the unit dev stands for, with the executor's default options.
func (e *Executor) unitSpec(dev core.Device) (core.Device, UnitSpec) {
	base, spec := unitOf(dev)
	return base, spec.withDefaults(e.cfg.contextOptions)
}

// unitName is the name under which the executor knows dev's unit.
func (e *Executor) unitName(dev core.Device) string {
	_, spec := e.unitSpec(dev)
	return spec.String()
}

// Unit returns the executor's open unit for dev (a device or a UnitDevice), opening it on first
// use: the context its sessions prepare and run in, for callers that allocate or import
// buffers there. The unit stays the executor's: do not close it.
func (e *Executor) Unit(ctx context.Context, dev core.Device) (*Unit, error) {
	if dev == nil {
		return nil, fmt.Errorf("executor: nil device: %w", core.ErrInvalidArgument)
	}
	eu, err := e.open(ctx, dev)
	if err != nil {
		return nil, err
	}
	return eu.unit, nil
}

// open returns dev's unit, opening it on first use. A failed open is not remembered: a later
// call tries again.
func (e *Executor) open(ctx context.Context, dev core.Device) (*execUnit, error) {
	base, spec := e.unitSpec(dev)
	id := spec.String()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, errClosed
	}
	eu, ok := e.units[id]
	if !ok {
		eu = &execUnit{name: id, ready: make(chan struct{}), idx: -1}
		e.units[id] = eu
	}
	e.mu.Unlock()
	if !ok {
		eu.unit, eu.err = OpenUnit(ctx, base, spec)
		if eu.err != nil {
			e.mu.Lock()
			if e.units[id] == eu {
				delete(e.units, id)
			}
			e.mu.Unlock()
		} else {
			e.log.Debug("xpu: unit opened", "unit", id)
		}
		close(eu.ready)
	}
	select {
	case <-eu.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if eu.err != nil {
		return nil, eu.err
	}
	return eu, nil
}

// adopt makes dev's unit one of the runtime's (once) and returns its index there.
func (e *Executor) adopt(ctx context.Context, dev core.Device) (int, error) {
	eu, err := e.open(ctx, dev)
	if err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, errClosed
	}
	if eu.idx < 0 {
		if eu.idx, err = e.rt.addUnit(eu.unit); err != nil {
			eu.idx = -1
			return 0, err
		}
	}
	return eu.idx, nil
}

// drop closes dev's unit if no session placed nodes on it; a session with a private executor
// drops the units it analyzed but gave no node.
func (e *Executor) drop(dev core.Device) error {
	id := e.unitName(dev)
	e.mu.Lock()
	eu, ok := e.units[id]
	if ok {
		select {
		case <-eu.ready:
			ok = eu.err == nil && eu.idx < 0
		default:
			ok = false // still opening: another caller wants it
		}
	}
	if ok {
		delete(e.units, id)
	}
	e.mu.Unlock()
	if !ok {
		return nil
	}
	return eu.unit.Close()
}

// Close releases every executable, the arena and every unit. Sessions using the executor must
// be closed first.
func (e *Executor) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	units := e.units
	e.units = map[string]*execUnit{}
	e.mu.Unlock()
	var errs []error
	if held := e.rt.exes.held(); held > 0 {
		errs = append(errs, fmt.Errorf("executor: %d executable reference(s) still held by sessions: %w", held, core.ErrBadState))
	}
	// the runtime closes the units it adopted
	errs = append(errs, e.rt.Close())
	for id, eu := range units {
		<-eu.ready // a unit still opening finishes first
		if eu.err == nil && eu.idx < 0 {
			if err := eu.unit.Close(); err != nil {
				errs = append(errs, fmt.Errorf("unit %s: close: %w", id, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Alloc allocates a buffer of size bytes in the executor's arena, for dev's unit (opening it if
// needed; dev is a device or a UnitDevice). Such buffers can be bound to the graph inputs and
// outputs of a session Execution of a session that has the unit: every unit reads and writes
// them in place (or through its arena mirror when it cannot import host memory). kind is
// accepted for the Context.Alloc signature: arena memory is host memory every unit sees. The
// memory returns to the system with the executor (arena spans are not freed one by one); the
// buffer must not be used after the executor closes.
func (e *Executor) Alloc(ctx context.Context, dev core.Device, size int64, kind core.BufferKind) (core.Buffer, error) {
	if dev == nil {
		return nil, fmt.Errorf("executor: alloc: nil device: %w", core.ErrInvalidArgument)
	}
	eu, err := e.open(ctx, dev)
	if err != nil {
		return nil, err
	}
	span, err := e.rt.arena.Alloc(size)
	if err != nil {
		return nil, fmt.Errorf("unit %s: alloc %d bytes (kind %d): %w", eu.name, size, kind, err)
	}
	return &placedBuffer{arena: e.rt.arena, span: span, size: size, unit: eu.name}, nil
}

// placedBuffer is an arena span that knows the unit it was allocated for, so a session
// Execution can tell whether that unit is one of the session's.
type placedBuffer struct {
	arena *Arena
	span  Span
	size  int64
	unit  string // unit name

	mu     sync.Mutex
	closed bool
}

// bytes is the buffer's memory, or an error once it or the arena is closed.
func (b *placedBuffer) bytes() ([]byte, error) {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	mem := b.arena.Bytes(b.span)
	if closed || mem == nil {
		return nil, fmt.Errorf("buffer on %s: closed: %w", b.unit, core.ErrBadState)
	}
	return mem[:b.size:b.size], nil
}

// rangeOf is n bytes of the buffer at offset.
func (b *placedBuffer) rangeOf(offset int64, n int) ([]byte, error) {
	mem, err := b.bytes()
	if err != nil {
		return nil, err
	}
	if offset < 0 || offset > b.size || int64(n) > b.size-offset {
		return nil, fmt.Errorf("buffer on %s: %d bytes at %d of %d: %w", b.unit, n, offset, b.size, core.ErrInvalidArgument)
	}
	return mem[offset : offset+int64(n)], nil
}

// Size is the size asked of Alloc.
func (b *placedBuffer) Size() int64 { return b.size }

// Write copies src into the buffer at offset.
func (b *placedBuffer) Write(offset int64, src []byte) error {
	dst, err := b.rangeOf(offset, len(src))
	if err != nil {
		return err
	}
	copy(dst, src)
	return nil
}

// Read copies the buffer's bytes at offset into dst.
func (b *placedBuffer) Read(offset int64, dst []byte) error {
	src, err := b.rangeOf(offset, len(dst))
	if err != nil {
		return err
	}
	copy(dst, src)
	return nil
}

// Map returns the arena's bytes: valid until the executor closes.
func (b *placedBuffer) Map() ([]byte, error) { return b.bytes() }

// Unmap does nothing: the arena stays mapped.
func (b *placedBuffer) Unmap() error { return nil }

// Close ends the buffer's use; its memory returns with the arena.
func (b *placedBuffer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return nil
}
