package sparse

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/xpuhub/xpu/internal/safefile"
)

// ioAlign is the alignment of a direct read's file offset, length and buffer (the sidecar's
// tensor alignment, and the page size direct I/O needs everywhere it is offered).
const ioAlign = Alignment

// alignedBuf returns n bytes starting on an ioAlign boundary (Go's heap does not move objects,
// so the address stays aligned).
func alignedBuf(n int) []byte {
	b := make([]byte, n+ioAlign)
	off := int(uintptr(unsafe.Pointer(&b[0])) & (ioAlign - 1))
	if off != 0 {
		off = ioAlign - off
	}
	return b[off : off+n : off+n]
}

// bundleFile is the sidecar opened for pread, direct where the filesystem allows.
type bundleFile struct {
	path string
	// mu guards f, which a refused direct read replaces (readers may be reading at the time)
	mu     sync.RWMutex
	f      *os.File
	direct atomic.Bool // false after a fallback to buffered reads (Stats reads it)
	log    *slog.Logger
	// bytes and reads count what was read (for Stats; the I/O worker and Load write them).
	bytes, reads atomic.Int64
}

func openBundleFile(path string, buffered bool, log *slog.Logger) (*bundleFile, error) {
	b := &bundleFile{path: path, log: log}
	if !buffered {
		f, err := openDirect(path)
		if err == nil {
			b.f = f
			b.direct.Store(true)
			return b, nil
		}
		log.Debug("sparse: no direct I/O, reading through the page cache", "file", path, "err", err)
	}
	f, err := safefile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("sparse: opening the sidecar for reads: %w", err)
	}
	b.f = f
	return b, nil
}

// readAt is pread; a direct read the file refuses (some filesystems open with O_DIRECT and fail
// the read) switches the file to buffered reads for good and retries.
func (b *bundleFile) readAt(p []byte, off int64) (int, error) {
	b.mu.RLock()
	n, err := b.f.ReadAt(p, off)
	b.mu.RUnlock()
	if err != nil && n == 0 && directRefused(err) {
		b.mu.Lock()
		if b.direct.Load() { // the first reader refused switches; the others retry
			f, oerr := safefile.Open(b.path)
			if oerr != nil {
				b.mu.Unlock()
				return 0, errors.Join(err, oerr)
			}
			b.log.Debug("sparse: direct read refused, reading through the page cache", "file", b.path, "err", err)
			_ = b.f.Close()
			b.f = f
			b.direct.Store(false)
		}
		n, err = b.f.ReadAt(p, off)
		b.mu.Unlock()
	}
	b.bytes.Add(int64(n))
	b.reads.Add(1)
	return n, err
}

// readSpan reads the file's bytes [off, off+n) through staging (aligned, at least
// n+2·ioAlign bytes) and returns them; a direct read widens the span to aligned bounds. A read
// that ends early is ErrFormat naming the file and offset: the sidecar is shorter than its
// header says.
func (b *bundleFile) readSpan(staging []byte, off, n int64) ([]byte, error) {
	start, end := off, off+n
	if b.direct.Load() {
		start, end = off&^(ioAlign-1), (off+n+ioAlign-1)&^(ioAlign-1)
	}
	got, err := b.readAt(staging[:end-start], start)
	if need := off + n - start; int64(got) < need {
		// A direct read that reaches the end of the file mid-page returns what is there; should
		// the next pread at that unaligned offset be refused, that too is the file ending early.
		if err == nil || errors.Is(err, io.EOF) || (got > 0 && directRefused(err)) {
			return nil, fmt.Errorf("%w: %s: short read at offset %d: %d of %d bytes (truncated sidecar?)",
				ErrFormat, b.path, off, max(0, int64(got)-(off-start)), n)
		}
		return nil, fmt.Errorf("sparse: %s: reading %d bytes at offset %d: %w", b.path, n, off, err)
	}
	return staging[off-start : off-start+n], nil
}

func (b *bundleFile) close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f.Close()
}

// ioReq is one Select's cold reads: bundle rows of one layer and the cold slots they go to.
type ioReq struct {
	ctx   context.Context
	layer int
	// seq orders the requests (they complete in that order); prefetch marks a look-ahead.
	seq      int64
	prefetch bool
	// rows holds row<<32 | slot, ascending (so by file offset).
	rows []uint64
}

// ioWorker is the goroutine that reads cold bundles into the cache: one request at a time,
// rows sorted by offset, neighbours (gap ≤ gap rows) coalesced into one read. A request's reads
// are spread over len(staging) readers, each with its own buffer: flash (and the virtual disks
// of this project's machines) serve several requests in flight faster than one at a time for
// reads of a few hundred KiB (about twice as fast with four in flight where this was measured:
// the lab notes on sparse FFN decode).
type ioWorker struct {
	file     *bundleFile
	staging  [][]byte // one buffer per reader
	cache    []byte
	rowBytes int64
	coldBase int64   // the first cold slot's cache row
	bases    []int64 // per layer, the file offset of bundle row 0
	gap      int64
	busy     atomic.Int64 // nanoseconds spent serving
	reqs     chan *ioReq
	done     chan error
	spans    []ioSpan // scratch of serve
}

// ioSpan is one coalesced read: the request's rows [i, j), bundle rows first..last.
type ioSpan struct{ i, j, first, last int }

func (w *ioWorker) run() {
	for req := range w.reqs {
		t0 := time.Now()
		err := w.serve(req)
		w.busy.Add(int64(time.Since(t0)))
		w.done <- err
	}
}

func (w *ioWorker) serve(req *ioReq) error {
	rb := w.rowBytes
	maxSpan := int64(len(w.staging[0])) - 2*ioAlign
	rows := req.rows
	spans := w.spans[:0]
	for i := 0; i < len(rows); {
		first := int64(rows[i] >> 32)
		last, j := first, i+1
		for ; j < len(rows); j++ {
			r := int64(rows[j] >> 32)
			if r-last-1 > w.gap || (r+1-first)*rb > maxSpan {
				break
			}
			last = r
		}
		spans = append(spans, ioSpan{i: i, j: j, first: int(first), last: int(last)})
		i = j
	}
	w.spans = spans
	read := func(staging []byte, sp ioSpan) error {
		if err := req.ctx.Err(); err != nil {
			return err
		}
		first, last := int64(sp.first), int64(sp.last)
		off := w.bases[req.layer] + first*rb
		data, err := w.file.readSpan(staging, off, (last+1-first)*rb)
		if err != nil {
			return fmt.Errorf("sparse: layer %d's bundle rows %d..%d: %w", req.layer, first, last, err)
		}
		for k := sp.i; k < sp.j; k++ {
			r, s := int64(rows[k]>>32), int64(uint32(rows[k]))
			copy(w.cache[(w.coldBase+s)*rb:][:rb], data[(r-first)*rb:][:rb])
		}
		return nil
	}
	n := min(len(w.staging), len(spans))
	if n <= 1 {
		for _, sp := range spans {
			if err := read(w.staging[0], sp); err != nil {
				return err
			}
		}
		return nil
	}
	// Readers take the spans in file order; each span's rows go to their own slots, so the
	// readers' copies never overlap.
	var next atomic.Int64
	errs := make([]error, n)
	var wg sync.WaitGroup
	for k := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(spans) {
					return
				}
				if err := read(w.staging[k], spans[i]); err != nil {
					errs[k] = err
					next.Store(int64(len(spans))) // the others stop after their read
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
