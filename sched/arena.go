package sched

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/shmem"
)

// Arena is host memory that every unit of a Runtime sees without copies: memfd-backed blocks,
// mapped once into this process and imported by each unit that touches them (by host pointer
// with core.CapImportHost, else by fd with core.CapImportFD, which also reaches an isolated
// backend's child process). Tensors that cross units — the KV cache, the activations between
// partitions, the per-position inputs — live in spans of it. The model's weights do not: they are
// mapped from the GGUF file and imported per context by the ABI layer.
//
// Spans are carved at plan time and never freed one by one: the arena lives as long as its
// Runtime. It is safe for concurrent use.
type Arena struct {
	mu     sync.Mutex
	blocks []*arenaBlock
	closed bool
}

// arenaBlock is one memfd and its mapping.
type arenaBlock struct {
	fd   int
	mem  []byte
	used int64
}

// Span is a range of an Arena: the unit of placement for tensors that cross units.
type Span struct {
	block     int
	Off, Size int64
}

// IsZero reports whether s is the zero Span (no memory).
func (s Span) IsZero() bool { return s.Size == 0 }

// Slice is the size bytes of s from byte off: the same memory, as a span of its own (a
// binding of part of a tensor, such as one shard's heads of a K/V cache row).
func (s Span) Slice(off, size int64) (Span, error) {
	if off < 0 || size <= 0 || off+size > s.Size {
		return Span{}, fmt.Errorf("bytes %d+%d of a %d-byte span: %w", off, size, s.Size, core.ErrInvalidArgument)
	}
	return Span{block: s.block, Off: s.Off + off, Size: size}, nil
}

const (
	// arenaBlockMin is the smallest block: small spans (positions, ids, activations) share.
	arenaBlockMin = 4 << 20
	// arenaAlign aligns every span: a cache line, and any vector width a kernel uses.
	arenaAlign = 256
)

// NewArena makes an empty arena.
func NewArena() *Arena { return &Arena{} }

// Alloc carves size bytes (zeroed) out of the arena.
func (a *Arena) Alloc(size int64) (Span, error) {
	if size <= 0 {
		return Span{}, fmt.Errorf("arena: alloc %d bytes: %w", size, core.ErrInvalidArgument)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return Span{}, fmt.Errorf("arena: alloc: closed: %w", core.ErrBadState)
	}
	size = alignUp(size, arenaAlign)
	if n := len(a.blocks); n > 0 {
		if b := a.blocks[n-1]; b.used+size <= int64(len(b.mem)) {
			s := Span{block: n - 1, Off: b.used, Size: size}
			b.used += size
			return s, nil
		}
	}
	b, err := newArenaBlock(max(alignUp(size, int64(unix.Getpagesize())), arenaBlockMin))
	if err != nil {
		return Span{}, err
	}
	b.used = size
	a.blocks = append(a.blocks, b)
	return Span{block: len(a.blocks) - 1, Size: size}, nil
}

// Allocs is a run of allocations that keeps the first error, so that a program's many spans are
// carved out with one error check at the end.
type Allocs struct {
	a   *Arena
	Err error
}

// Allocs starts a run of allocations from a.
func (a *Arena) Allocs() *Allocs { return &Allocs{a: a} }

// Alloc is Arena.Alloc, or the zero Span once an allocation of the run has failed (Err).
func (r *Allocs) Alloc(size int64) Span {
	if r.Err != nil {
		return Span{}
	}
	s, err := r.a.Alloc(size)
	r.Err = err
	return s
}

func newArenaBlock(size int64) (*arenaBlock, error) {
	fd, err := shmem.NewFD("xpu-arena", size, shmem.Options{})
	if err != nil {
		return nil, fmt.Errorf("arena: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("arena: mmap %d bytes: %w", size, err)
	}
	return &arenaBlock{fd: fd, mem: mem}, nil
}

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

// Bytes is the host view of s: writes are seen by every unit that imported the block.
func (a *Arena) Bytes(s Span) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s.Size == 0 || s.block >= len(a.blocks) {
		return nil
	}
	return a.blocks[s.block].mem[s.Off : s.Off+s.Size : s.Off+s.Size]
}

// Size is the bytes mapped, over all blocks.
func (a *Arena) Size() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for _, b := range a.blocks {
		n += int64(len(b.mem))
	}
	return n
}

// block returns block i's fd and memory.
func (a *Arena) block(i int) (*arenaBlock, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || i < 0 || i >= len(a.blocks) {
		return nil, fmt.Errorf("arena: no block %d: %w", i, core.ErrBadState)
	}
	return a.blocks[i], nil
}

// Close unmaps every block. The buffers units imported must be closed first.
func (a *Arena) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	var errs []error
	for _, b := range a.blocks {
		errs = append(errs, unix.Munmap(b.mem), unix.Close(b.fd))
	}
	a.blocks = nil
	return errors.Join(errs...)
}

// importMode is how a unit sees the arena.
type importMode int

const (
	importHost importMode = iota // Context.Import of the mapping
	importFD                     // Context.ImportFD of the memfd
	importCopy                   // a device buffer per block, copied to and from the arena
)

func (m importMode) String() string {
	return [...]string{"host pointer", "fd", "copy"}[m]
}

// modeFor picks how a unit with caps sees the arena: zero-copy whenever it can.
func modeFor(caps core.Caps) importMode {
	switch {
	case caps.Has(core.CapImportHost):
		return importHost
	case caps.Has(core.CapImportFD):
		return importFD
	}
	return importCopy
}

// unitMem is one unit's view of the arena: a buffer per block, imported or (importCopy) a
// mirror the runtime copies through.
type unitMem struct {
	mode importMode
	mu   sync.Mutex // Compile binds while workers run
	bufs []core.Buffer
}

// buffer returns the unit's buffer for block i, importing (or allocating the mirror) on first
// use. A unit whose import fails falls back to a mirror: correct, and counted as copies.
func (m *unitMem) buffer(a *Arena, u *Unit, i int) (core.Buffer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for len(m.bufs) <= i {
		m.bufs = append(m.bufs, nil)
	}
	if m.bufs[i] != nil {
		return m.bufs[i], nil
	}
	b, err := a.block(i)
	if err != nil {
		return nil, err
	}
	var buf core.Buffer
	switch m.mode {
	case importHost:
		buf, err = u.Context().Import(b.mem)
	case importFD:
		buf, err = u.Context().ImportFD(b.fd, 0, int64(len(b.mem)))
	default:
		buf, err = u.Context().Alloc(int64(len(b.mem)), core.BufferDevice)
	}
	if err != nil {
		return nil, fmt.Errorf("unit %s: arena block %d (%d bytes) by %s: %w", u.Name(), i, len(b.mem), m.mode, err)
	}
	m.bufs[i] = buf
	return buf, nil
}

// mirror returns the unit's buffer for block i if it has made one, else nil.
func (m *unitMem) mirror(i int) core.Buffer {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i < 0 || i >= len(m.bufs) {
		return nil
	}
	return m.bufs[i]
}

// close releases the unit's imports and mirrors.
func (m *unitMem) close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for _, b := range m.bufs {
		if b != nil {
			errs = append(errs, b.Close())
		}
	}
	m.bufs = nil
	return errors.Join(errs...)
}
