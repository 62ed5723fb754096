package ref

import (
	"context"
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
)

// refContext owns buffers and executables on the reference device.
type refContext struct {
	dev *device

	handle
	live int // buffers and executables not yet closed
}

func (c *refContext) Device() core.Device { return c.dev }

// acquire counts a new object, refusing when the context or backend is closed.
func (c *refContext) acquire() error {
	if err := c.dev.b.check(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("ref: the context is closed: %w", core.ErrInvalidHandle)
	}
	c.live++
	return nil
}

func (c *refContext) release() {
	c.mu.Lock()
	c.live--
	c.mu.Unlock()
}

func (c *refContext) Alloc(size int64, kind core.BufferKind) (core.Buffer, error) {
	if size < 0 {
		return nil, fmt.Errorf("ref: alloc of %d bytes: %w", size, core.ErrInvalidArgument)
	}
	if kind != core.BufferDevice && kind != core.BufferHostVisible {
		return nil, fmt.Errorf("ref: buffer kind %d: %w", kind, core.ErrInvalidArgument)
	}
	mem, err := allocBytes(size)
	if err != nil {
		return nil, err
	}
	if err := c.acquire(); err != nil {
		return nil, err
	}
	return &buffer{ctx: c, mem: mem}, nil
}

// allocBytes turns the runtime's refusal of an impossible size into ErrOutOfMemory instead of a
// panic that would cross the public API.
func allocBytes(size int64) (mem []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			mem, err = nil, fmt.Errorf("ref: alloc of %d bytes: %v: %w", size, r, core.ErrOutOfMemory)
		}
	}()
	if size > math.MaxInt {
		return nil, fmt.Errorf("ref: alloc of %d bytes: %w", size, core.ErrOutOfMemory)
	}
	return make([]byte, size), nil
}

// Import wraps mem without copying: executions read and write it directly.
func (c *refContext) Import(mem []byte) (core.Buffer, error) {
	if err := c.acquire(); err != nil {
		return nil, err
	}
	return &buffer{ctx: c, mem: mem}, nil
}

// ImportFD is not offered: the reference has no CapImportFD.
func (c *refContext) ImportFD(fd int, offset, size int64) (core.Buffer, error) {
	return nil, fmt.Errorf("ref: fd import: %w", core.ErrUnsupported)
}

// Analyze answers YES for every node of a valid graph: the reference runs everything, at f32 or
// better (it computes in float64).
func (c *refContext) Analyze(ctx context.Context, g *core.Graph) ([]core.NodeVerdict, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("ref: analyze: %w", err)
	}
	p, err := compile(g)
	if err != nil {
		return nil, err
	}
	return p.verdicts(), nil
}

func (p *program) verdicts() []core.NodeVerdict {
	v := make([]core.NodeVerdict, len(p.nodes))
	for i := range v {
		v[i] = core.NodeVerdict{Supported: true, Precision: core.PrecF32}
	}
	return v
}

// Prepare validates g and captures it for the interpreter. A cache blob is ignored: the
// reference has no CapSerialize and nothing to compile.
func (c *refContext) Prepare(ctx context.Context, g *core.Graph, opts ...core.PrepareOption) (core.Executable, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("ref: prepare: %w", err)
	}
	p, err := compile(g)
	if err != nil {
		return nil, err
	}
	if err := c.acquire(); err != nil {
		return nil, err
	}
	return &executable{ctx: c, prog: p}, nil
}

func (c *refContext) NewFence(initial uint64) (core.Fence, error) {
	if err := c.dev.b.check(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("ref: the context is closed: %w", core.ErrInvalidHandle)
	}
	return newFence(initial), nil
}

// Close refuses while buffers or executables made here are still open.
func (c *refContext) Close() error {
	return c.closeOnce("context", func() error {
		if c.live > 0 {
			return fmt.Errorf("ref: context has %d open buffers or executables: %w", c.live, core.ErrBadState)
		}
		return nil
	})
}
