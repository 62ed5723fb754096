package sparse

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"
	"unsafe"
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
	path   string
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
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("sparse: opening the sidecar for reads: %w", err)
	}
	b.f = f
	return b, nil
}

// readAt is pread; a direct read the file refuses (some filesystems open with O_DIRECT and fail
// the read) switches the file to buffered reads for good and retries.
func (b *bundleFile) readAt(p []byte, off int64) (int, error) {
	n, err := b.f.ReadAt(p, off)
	if err != nil && n == 0 && b.direct.Load() && directRefused(err) {
		f, oerr := os.Open(b.path)
		if oerr != nil {
			return 0, errors.Join(err, oerr)
		}
		b.log.Debug("sparse: direct read refused, reading through the page cache", "file", b.path, "err", err)
		_ = b.f.Close()
		b.f = f
		b.direct.Store(false)
		n, err = b.f.ReadAt(p, off)
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

func (b *bundleFile) close() error { return b.f.Close() }

// ioReq is one Select's cold reads: bundle rows of one layer and the cold slots they go to.
type ioReq struct {
	ctx   context.Context
	layer int
	// rows holds row<<32 | slot, ascending (so by file offset).
	rows []uint64
}

// ioWorker is the single goroutine that reads cold bundles into the cache: one request at a
// time, rows sorted by offset, neighbours (gap ≤ gap rows) coalesced into one read.
type ioWorker struct {
	file     *bundleFile
	staging  []byte
	cache    []byte
	rowBytes int64
	coldBase int64   // the first cold slot's cache row
	bases    []int64 // per layer, the file offset of bundle row 0
	gap      int64
	busy     atomic.Int64 // nanoseconds spent serving
	reqs     chan *ioReq
	done     chan error
}

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
	maxSpan := int64(len(w.staging)) - 2*ioAlign
	rows := req.rows
	for i := 0; i < len(rows); {
		if err := req.ctx.Err(); err != nil {
			return err
		}
		first := int64(rows[i] >> 32)
		last, j := first, i+1
		for ; j < len(rows); j++ {
			r := int64(rows[j] >> 32)
			if r-last-1 > w.gap || (r+1-first)*rb > maxSpan {
				break
			}
			last = r
		}
		off := w.bases[req.layer] + first*rb
		data, err := w.file.readSpan(w.staging, off, (last+1-first)*rb)
		if err != nil {
			return fmt.Errorf("sparse: layer %d's bundle rows %d..%d: %w", req.layer, first, last, err)
		}
		for k := i; k < j; k++ {
			r, s := int64(rows[k]>>32), int64(uint32(rows[k]))
			copy(w.cache[(w.coldBase+s)*rb:][:rb], data[(r-first)*rb:][:rb])
		}
		i = j
	}
	return nil
}
