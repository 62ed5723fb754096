package sched

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/xpuhub/xpu/core"
)

// KV-cache compaction after a speculative verify step. A draft tree of T tokens was written at
// cache rows base..base+T-1 (tree order, parents before children) and verified in one pass
// with a tree mask; the tokens accepted form one root-to-leaf path, at tree indices keep
// (ascending). Compaction moves row base+keep[i] to row base+i, so the cache holds the
// accepted path contiguously, exactly as if those tokens had been decoded one by one.
// Rollback needs nothing here: the caller lowers its valid length to base+len(keep), and the
// rows past it are never read again (OPS.md: keys past the last visible one are not loaded)
// until a later step overwrites them.
//
// The move is a host memmove in the arena, not a device op: the cache lives in arena memory
// that every unit maps or imports (by pointer or fd, an isolated plugin's child included), the
// rows are few (the accepted path, a handful per layer) and contiguous per row, so a gather
// graph per layer would cost a prepare and a dispatch per cache to move a few hundred bytes.
// Units that import nothing keep a device mirror of each arena block; their mirror rows are
// rewritten too, so the mirror never holds the rejected rows where the path now lies.

// ErrBadRows wraps core.ErrInvalidArgument: a compaction's rows are not an ascending path
// inside the cache.
var ErrBadRows = fmt.Errorf("kv compaction: bad rows: %w", core.ErrInvalidArgument)

// checkKeep validates a compaction of rows base+keep[i] → base+i over a span of size bytes.
func checkKeep(size, rowBytes, base int64, keep []int) error {
	if rowBytes <= 0 || base < 0 {
		return fmt.Errorf("%w: row of %d bytes at base row %d", ErrBadRows, rowBytes, base)
	}
	prev := -1
	for i, k := range keep {
		if k <= prev {
			return fmt.Errorf("%w: keep[%d] = %d after %d (want strictly ascending, from 0)", ErrBadRows, i, k, prev)
		}
		prev = k
	}
	if len(keep) == 0 {
		return nil
	}
	rows := size / rowBytes
	if last := int64(keep[len(keep)-1]); base > rows || last >= rows-base {
		return fmt.Errorf("%w: row %d+%d past the %d rows of the span", ErrBadRows, base, last, rows)
	}
	return nil
}

// CompactRows moves row base+keep[i] of s (rows of rowBytes bytes) to row base+i, for every
// i, in place. keep must be strictly ascending from 0 or more, so each row moves down or stays
// and no row is overwritten before it has moved. It reports whether any row moved. The arena
// must not be in use by a program running on s meanwhile.
func (a *Arena) CompactRows(s Span, rowBytes, base int64, keep []int) (bool, error) {
	if err := checkKeep(s.Size, rowBytes, base, keep); err != nil {
		return false, err
	}
	b, err := a.block(s.block)
	if err != nil {
		return false, err
	}
	if s.Off < 0 || s.Off+s.Size > int64(len(b.mem)) {
		return false, fmt.Errorf("%w: span [%d, %d) outside its block of %d bytes", ErrBadRows, s.Off, s.Off+s.Size, len(b.mem))
	}
	mem := b.mem[s.Off : s.Off+s.Size]
	moved := false
	for i, k := range keep {
		if k == i {
			continue
		}
		dst, src := (base+int64(i))*rowBytes, (base+int64(k))*rowBytes
		copy(mem[dst:dst+rowBytes], mem[src:src+rowBytes])
		moved = true
	}
	return moved, nil
}

// CompactKV compacts the accepted path of a verify step in each of spans (a model's K and V
// caches, every layer: see Arena.CompactRows for base and keep), then brings the mirrors of
// units that copy the arena (they import neither host memory nor fds) up to date for the
// compacted rows. The caller then sets its cache length to base+len(keep). No program may run
// on these spans meanwhile; other programs of the runtime may.
func (rt *Runtime) CompactKV(ctx context.Context, spans []Span, rowBytes, base int64, keep []int) error {
	rt.mu.Lock()
	closed := rt.closed
	rt.mu.Unlock()
	if closed {
		return fmt.Errorf("runtime: compact kv: closed: %w", core.ErrBadState)
	}
	for _, s := range spans { // all checked before any row moves
		if err := checkKeep(s.Size, rowBytes, base, keep); err != nil {
			return err
		}
	}
	start := time.Now()
	var copies, bytes int64
	var errs []error
	for _, s := range spans {
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, err)...)
		}
		moved, err := rt.arena.CompactRows(s, rowBytes, base, keep)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		if !moved {
			continue
		}
		// the path's rows are now contiguous: one write per mirror and span
		off, n := base*rowBytes, int64(len(keep))*rowBytes
		host := rt.arena.Bytes(s)[off : off+n]
		for i, m := range rt.mem {
			if m.mode != importCopy {
				continue
			}
			buf := m.mirror(s.block)
			if buf == nil {
				continue // the unit never used this block: no mirror to keep coherent
			}
			if err := buf.Write(s.Off+off, host); err != nil {
				errs = append(errs, fmt.Errorf("unit %s: mirror of compacted rows: %w", rt.units[i].Name(), err))
				continue
			}
			copies++
			bytes += n
		}
	}
	rt.copies.Add(copies)
	rt.copyBytes.Add(bytes)
	if copies > 0 {
		rt.cfg.trace.Slice("runtime", "kv compact", start, time.Now(), map[string]any{"bytes": bytes, "rows": len(keep)})
	}
	return errors.Join(errs...)
}
