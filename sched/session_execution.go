//go:build ignore

package sched

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/xpuhub/xpu/core"
)

// placedBuffer is a buffer that knows its device, so a session Execution can tell whether a
// partition can use it in place or needs a copy.
type placedBuffer struct {
	core.Buffer
	device string // unit name
}

// Alloc allocates a buffer in the context of dev's unit (opening it if needed; dev is a device
// or a UnitDevice). Such buffers can be bound to the graph inputs and outputs of a session
// Execution: a partition on the same unit uses them in place, others get a copy. Close the
// buffers before the executor.
func (e *Executor) Alloc(ctx context.Context, dev core.Device, size int64, kind core.BufferKind) (core.Buffer, error) {
	ec, err := e.context(ctx, dev)
	if err != nil {
		return nil, err
	}
	b, err := ec.ctx.Alloc(size, kind)
	if err != nil {
		return nil, fmt.Errorf("unit %s: alloc %d bytes: %w", ec.name, size, err)
	}
	return &placedBuffer{Buffer: b, device: ec.name}, nil
}

// Alloc allocates a buffer on dev through the session's executor (see Executor.Alloc). With a
// private executor, close the buffers before the session.
func (s *Session) Alloc(ctx context.Context, dev core.Device, size int64, kind core.BufferKind) (core.Buffer, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, fmt.Errorf("session: alloc: %w", errClosed)
	}
	return s.exec.Alloc(ctx, dev, size, kind)
}

// NewExecution returns an Execution of the whole session: a binding set of its own, driven like
// a backend's. Bind takes graph inputs then outputs (Graph.Inputs, Graph.Outputs order), each
// bound to a buffer from Alloc at an offset; Run executes every partition, using bound buffers
// in place on their own device and copying through host memory for the others. Rebinding
// between runs is cheap: the LLM runtime binds its attention K/V outputs at the next cache row
// of a KV cache buffer before every step. An Execution runs one submission at a time; use
// several for concurrency.
func (s *Session) NewExecution() (core.Execution, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, fmt.Errorf("session: new execution: %w", errClosed)
	}
	rs, err := s.newRunState(true)
	if err != nil {
		return nil, fmt.Errorf("session: new execution: %w", err)
	}
	rs.bound = make([]*boundIO, len(s.graph.Inputs)+len(s.graph.Outputs))
	x := &sessionExecution{s: s, rs: rs}
	s.execMu.Lock()
	s.execs[x] = struct{}{}
	s.execMu.Unlock()
	return x, nil
}

// sessionExecution implements Execution over a session's partitions. Lock order: the
// session's mu, then the execution's.
type sessionExecution struct {
	s      *Session
	mu     sync.Mutex
	rs     *runState
	closed bool
}

func (x *sessionExecution) tensor(io int) (*core.Tensor, error) {
	t, err := x.s.graph.Binding(io)
	if err != nil {
		return nil, fmt.Errorf("session execution: %w", err)
	}
	return t, nil
}

// Bind binds graph input or output io to buf at offset. buf must come from Session.Alloc or
// Executor.Alloc on one of the session's devices, and hold the tensor at offset.
func (x *sessionExecution) Bind(io int, buf core.Buffer, offset int64) error {
	s := x.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed || s.closed {
		return fmt.Errorf("session execution: bind: %w", errClosed)
	}
	t, err := x.tensor(io)
	if err != nil {
		return err
	}
	pb, ok := buf.(*placedBuffer)
	if !ok || pb == nil {
		return fmt.Errorf("session execution: bind %s: the buffer must come from Session.Alloc or Executor.Alloc: %w",
			t, core.ErrInvalidArgument)
	}
	d, ok := s.devIndex[pb.device]
	if !ok {
		return fmt.Errorf("session execution: bind %s: unit %s is not one of the session's: %w", t, pb.device,
			core.ErrInvalidArgument)
	}
	if offset < 0 || offset > pb.Size() || t.Bytes() > pb.Size()-offset {
		return fmt.Errorf("session execution: bind %s (%d bytes) at %d of a %d-byte buffer: %w", t, t.Bytes(),
			offset, pb.Size(), core.ErrInvalidArgument)
	}
	rs := x.rs
	if prev := rs.bound[io]; prev != nil && prev.device != d {
		// the old device gets a session buffer back, at the next Run (ensure)
		delete(rs.loc, bufKey{t.ID, prev.device})
	}
	b := &boundIO{device: d, loc: location{buf: pb.Buffer, off: offset}}
	// Zero copy where the tensor lives on the buffer's device.
	if k := (bufKey{t.ID, d}); s.plan.lives[k] {
		if err := s.relocate(rs, k, b.loc); err != nil {
			return err
		}
	}
	rs.bound[io] = b
	return nil
}

// Run executes the session with the bound buffers; every input and output must be bound.
func (x *sessionExecution) Run(ctx context.Context) error {
	s := x.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed || s.closed {
		return fmt.Errorf("session execution: run: %w", errClosed)
	}
	for io, b := range x.rs.bound {
		if b == nil {
			t, _ := x.tensor(io)
			return fmt.Errorf("session execution: run: %s is not bound: %w", t, core.ErrBadState)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.ensure(x.rs); err != nil {
		return fmt.Errorf("session execution: run: %w", err)
	}
	_, n, err := s.execute(ctx, x.rs, nil)
	if err != nil {
		return fmt.Errorf("session execution: run: %w", err)
	}
	s.countRun(n)
	return nil
}

// Submit waits for every wait point, runs, then signals: it returns when the work is done.
func (x *sessionExecution) Submit(waits []core.FencePoint, signal *core.FencePoint) error {
	if signal != nil && signal.Fence == nil {
		return fmt.Errorf("session execution: submit: the signal point has no fence: %w", core.ErrInvalidArgument)
	}
	ctx := context.Background()
	for i, w := range waits {
		if w.Fence == nil {
			return fmt.Errorf("session execution: submit: wait %d has no fence: %w", i, core.ErrInvalidArgument)
		}
		if err := w.Fence.Wait(ctx, w.Value); err != nil {
			return fmt.Errorf("session execution: submit: wait %d: %w", i, err)
		}
	}
	if err := x.Run(ctx); err != nil {
		return err
	}
	if signal != nil {
		if err := signal.Fence.Signal(signal.Value); err != nil {
			return fmt.Errorf("session execution: submit: signal: %w", err)
		}
	}
	return nil
}

// Close releases the execution's partitions' executions and buffers (not the bound buffers).
func (x *sessionExecution) Close() error {
	x.s.execMu.Lock()
	delete(x.s.execs, x)
	x.s.execMu.Unlock()
	return x.close()
}

func (x *sessionExecution) close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil
	}
	x.closed = true
	return x.rs.close()
}

// closeExecutions closes the executions the caller left open; Session.Close calls it.
func (s *Session) closeExecutions() error {
	s.execMu.Lock()
	xs := make([]*sessionExecution, 0, len(s.execs))
	for x := range s.execs {
		xs = append(xs, x)
	}
	clear(s.execs)
	s.execMu.Unlock()
	var errs []error
	for _, x := range xs {
		errs = append(errs, x.close())
	}
	return errors.Join(errs...)
}
