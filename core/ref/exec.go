package ref

import (
	"context"
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// executable is a prepared program; immutable, so executions share it freely.
type executable struct {
	ctx  *refContext
	prog *program

	handle
}

func (e *executable) NewExecution() (core.Execution, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, fmt.Errorf("ref: the executable is closed: %w", core.ErrInvalidHandle)
	}
	n := len(e.prog.inputs) + len(e.prog.outputs)
	return &execution{exe: e, binds: make([]binding, n)}, nil
}

func (e *executable) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// Serialize is not offered: the reference has no CapSerialize.
func (e *executable) Serialize() ([]byte, error) {
	return nil, fmt.Errorf("ref: serialize: %w", core.ErrUnsupported)
}

func (e *executable) Verdicts() []core.NodeVerdict { return e.prog.verdicts() }

func (e *executable) Close() error {
	return e.closeOnce("executable", func() error { e.ctx.release(); return nil })
}

type binding struct {
	buf *buffer
	off int64
}

// execution is one binding set; mu serializes Bind and runs, so one submission runs at a time.
type execution struct {
	exe *executable

	handle
	binds []binding
}

// tensor returns the graph tensor bound at io: inputs first, then outputs.
func (x *execution) tensor(io int) tensorInfo {
	p := x.exe.prog
	if io < len(p.inputs) {
		return p.tensors[p.inputs[io]]
	}
	return p.tensors[p.outputs[io-len(p.inputs)]]
}

func (x *execution) Bind(io int, buf core.Buffer, offset int64) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return fmt.Errorf("ref: bind: the execution is closed: %w", core.ErrInvalidHandle)
	}
	if io < 0 || io >= len(x.binds) {
		return fmt.Errorf("ref: bind: io %d out of range [0, %d): %w", io, len(x.binds), core.ErrInvalidArgument)
	}
	b, ok := buf.(*buffer)
	if !ok || b == nil || b.ctx != x.exe.ctx {
		return fmt.Errorf("ref: bind io %d: the buffer is not from this context: %w", io, core.ErrInvalidArgument)
	}
	t := x.tensor(io)
	if err := b.span(offset, t.bytes()); err != nil {
		return fmt.Errorf("ref: bind io %d (%s %s%s, %d bytes) at offset %d: %w", io, t.name, t.dt, t.shape, t.bytes(), offset, err)
	}
	x.binds[io] = binding{buf: b, off: offset}
	return nil
}

// Run executes synchronously. The bound memory is read and written in place; outputs are
// written after every node has run, so an output may share memory with an input.
func (x *execution) Run(ctx context.Context) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return fmt.Errorf("ref: run: the execution is closed: %w", core.ErrInvalidHandle)
	}
	if x.exe.isClosed() {
		return fmt.Errorf("ref: run: the executable is closed: %w", core.ErrInvalidHandle)
	}
	if err := x.exe.ctx.dev.b.check(); err != nil {
		return err
	}
	p := x.exe.prog
	views := make([][]byte, len(x.binds))
	for io, bd := range x.binds {
		t := x.tensor(io)
		if bd.buf == nil {
			return fmt.Errorf("ref: run: io %d (%s) is not bound: %w", io, t.name, core.ErrBadState)
		}
		// The buffer may have been closed since Bind.
		if err := bd.buf.span(bd.off, t.bytes()); err != nil {
			return fmt.Errorf("ref: run: io %d (%s): %w", io, t.name, err)
		}
		views[io] = bd.buf.mem[bd.off : bd.off+t.bytes()]
	}
	nin := len(p.inputs)
	outs := make([][]byte, len(p.outputs))
	for i := range outs {
		outs[i] = make([]byte, len(views[nin+i]))
	}
	if err := p.run(ctx, views[:nin], outs); err != nil {
		return err
	}
	for i, o := range outs {
		copy(views[nin+i], o)
	}
	return nil
}

// Submit waits for every wait point, runs, then signals: the reference has no CapAsync, so it
// returns when the work is done. A wait point that is never reached blocks it.
func (x *execution) Submit(waits []core.FencePoint, signal *core.FencePoint) error {
	if signal != nil && signal.Fence == nil {
		return fmt.Errorf("ref: submit: the signal point has no fence: %w", core.ErrInvalidArgument)
	}
	for i, w := range waits {
		if w.Fence == nil {
			return fmt.Errorf("ref: submit: wait %d has no fence: %w", i, core.ErrInvalidArgument)
		}
	}
	ctx := context.Background()
	for i, w := range waits {
		if err := w.Fence.Wait(ctx, w.Value); err != nil {
			return fmt.Errorf("ref: submit: wait %d: %w", i, err)
		}
	}
	if err := x.Run(ctx); err != nil {
		return err
	}
	if signal != nil {
		if err := signal.Fence.Signal(signal.Value); err != nil {
			return fmt.Errorf("ref: submit: signal: %w", err)
		}
	}
	return nil
}

func (x *execution) Close() error {
	return x.closeOnce("execution", func() error { x.binds = nil; return nil })
}
