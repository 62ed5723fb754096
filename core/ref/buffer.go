package ref

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// buffer is host memory: allocated here, or imported (zero-copy) from the caller.
type buffer struct {
	ctx *refContext
	mem []byte

	handle
	maps int
}

func (b *buffer) Size() int64 { return int64(len(b.mem)) }

// span checks that [off, off+n) lies in the buffer and the buffer is open.
func (b *buffer) span(off, n int64) error {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return fmt.Errorf("ref: buffer is closed: %w", core.ErrInvalidHandle)
	}
	if off < 0 || n < 0 || off > int64(len(b.mem))-n {
		return fmt.Errorf("ref: range [%d, %d+%d) outside a %d-byte buffer: %w", off, off, n, len(b.mem), core.ErrInvalidArgument)
	}
	return nil
}

func (b *buffer) Write(offset int64, src []byte) error {
	if err := b.span(offset, int64(len(src))); err != nil {
		return err
	}
	copy(b.mem[offset:], src)
	return nil
}

func (b *buffer) Read(offset int64, dst []byte) error {
	if err := b.span(offset, int64(len(dst))); err != nil {
		return err
	}
	copy(dst, b.mem[offset:])
	return nil
}

// Map returns the buffer's own memory: every reference buffer is host memory.
func (b *buffer) Map() ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("ref: map: buffer is closed: %w", core.ErrInvalidHandle)
	}
	b.maps++
	return b.mem, nil
}

func (b *buffer) Unmap() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("ref: unmap: buffer is closed: %w", core.ErrInvalidHandle)
	}
	if b.maps == 0 {
		return fmt.Errorf("ref: unmap of a buffer that is not mapped: %w", core.ErrBadState)
	}
	b.maps--
	return nil
}

func (b *buffer) Close() error {
	return b.closeOnce("buffer", func() error { b.ctx.release(); return nil })
}
