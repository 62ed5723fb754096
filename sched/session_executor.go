//go:build ignore

package sched

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"

	"github.com/xpuhub/xpu/core"
)

// Executor owns one open Unit (one context) per execution unit and a cache of prepared
// executables, so that several sessions over the same weights share them: constants are
// uploaded once per context, and a graph prepared once (same unit, structure, shapes,
// attributes and constant slices) is not prepared again. Units are identified by their name
// (UnitName with the executor's default options filled in: "neon:0", "neon:0{cpus=1}"), so
// two units of one device get two contexts; an executor serves one set of loaded backends. An
// Executor is safe for concurrent use.
type Executor struct {
	cfg sessionConfig
	log *slog.Logger

	mu     sync.Mutex
	ctxs   map[string]*execContext // by unit name
	exes   *exeCache               // by prepareKey, whose prefix is the unit name
	closed bool
}

// execContext is one unit's context. Units of devices without CapConcurrent get their
// executions serialized through run, across every session of the executor.
type execContext struct {
	name       string // the unit's name
	concurrent bool   // CapConcurrent: executions may overlap
	run        sync.Mutex
	// ready is closed once the unit is open (unit, ctx) or failed to open (err); the first
	// caller opens it outside the executor's lock, so units open in parallel.
	ready chan struct{}
	unit  *Unit
	ctx   core.Context
	err   error
}

// DefaultCacheSize is how many unused prepared executables an Executor keeps.
const DefaultCacheSize = 64

// NewExecutor makes an executor. Of the session options, WithContextOptions (default options
// for every unit it opens), WithLogger and WithCacheSize apply; the others are per session.
func NewExecutor(opts ...SessionOption) *Executor {
	cfg := newSessionConfig(opts)
	return &Executor{cfg: cfg, log: cfg.logger, ctxs: map[string]*execContext{},
		exes: newExeCache(cfg.cacheSize, cfg.logger)}
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
	ec, err := e.context(ctx, dev)
	if err != nil {
		return nil, err
	}
	return ec.unit, nil
}

// context returns the unit's context, opening it on first use.
func (e *Executor) context(ctx context.Context, dev core.Device) (*execContext, error) {
	base, spec := e.unitSpec(dev)
	id := spec.String()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, errClosed
	}
	ec, ok := e.ctxs[id]
	if !ok {
		ec = &execContext{name: id, concurrent: base.Info().Caps.Has(core.CapConcurrent), ready: make(chan struct{})}
		e.ctxs[id] = ec
	}
	e.mu.Unlock()
	if !ok {
		ec.unit, ec.err = OpenUnit(ctx, base, spec)
		if ec.err != nil {
			e.mu.Lock()
			if e.ctxs[id] == ec { // let a later call try again
				delete(e.ctxs, id)
			}
			e.mu.Unlock()
		} else {
			ec.ctx = ec.unit.Context()
			e.log.Debug("xpu: unit opened", "unit", id)
		}
		close(ec.ready)
	}
	select {
	case <-ec.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if ec.err != nil {
		return nil, ec.err
	}
	return ec, nil
}

// dropContext closes a unit's context if nothing was prepared in it; a private executor
// uses it for units that were analyzed but got no node.
func (e *Executor) dropContext(dev core.Device) error {
	id := e.unitName(dev)
	e.mu.Lock()
	ec, ok := e.ctxs[id]
	if ok && e.exes.holds(id+"|") {
		ok = false
	}
	if ok {
		delete(e.ctxs, id)
	}
	e.mu.Unlock()
	if !ok {
		return nil
	}
	<-ec.ready
	return ec.unit.Close()
}

// prepare returns the executable of g on ec, from the cache when the same graph was prepared
// there before. The caller closes it to give its reference back.
func (e *Executor) prepare(ctx context.Context, ec *execContext, g *core.Graph) (core.Executable, error) {
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return nil, errClosed
	}
	return e.exes.get(ctx, prepareKey(ec.name, g), g, func(ctx context.Context) (core.Executable, error) {
		return ec.ctx.Prepare(ctx, g)
	})
}

// Close releases every executable and context. Sessions using the executor must be closed
// first.
func (e *Executor) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	var errs []error
	if held := e.exes.held(); held > 0 {
		errs = append(errs, fmt.Errorf("executor: %d executable reference(s) still held by sessions: %w", held, core.ErrBadState))
	}
	errs = append(errs, e.exes.close())
	ctxs := e.ctxs
	e.ctxs = map[string]*execContext{}
	e.mu.Unlock()
	// Outside the lock: a context still opening finishes first.
	for id, ec := range ctxs {
		<-ec.ready
		if err := ec.unit.Close(); err != nil {
			errs = append(errs, fmt.Errorf("unit %s: close: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// prepareKey identifies a prepared graph: the unit (an executable lives in that unit's
// context, so the backend build cannot change under it) and the graph's structure, shapes,
// attributes and constants (by address and length: the backend uploaded those bytes).
func prepareKey(unit string, g *core.Graph) string {
	h := sha256.New()
	var b [8]byte
	put := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	for _, t := range g.Tensors {
		put(uint64(t.DType))
		put(uint64(t.Kind))
		put(uint64(len(t.Shape)))
		for _, d := range t.Shape {
			put(uint64(d))
		}
		if t.Kind == core.KindConst {
			fmt.Fprintf(h, "%p/%d", t.Data, len(t.Data))
		}
	}
	for _, n := range g.Nodes {
		put(uint64(n.Op))
		put(uint64(len(n.Inputs)))
		for _, in := range n.Inputs {
			put(uint64(in.ID))
		}
		put(uint64(n.Output.ID))
		for _, v := range n.IAttr {
			put(uint64(v))
		}
		for _, v := range n.FAttr {
			put(uint64(math.Float32bits(v)))
		}
	}
	for _, ts := range [][]*core.Tensor{g.Inputs, g.Outputs} {
		put(uint64(len(ts)))
		for _, t := range ts {
			put(uint64(t.ID))
		}
	}
	return unit + "|" + hex.EncodeToString(h.Sum(nil))
}
