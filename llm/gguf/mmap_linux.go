//go:build linux

package gguf

import (
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// On Linux the mapping is guarded against the file being overwritten or truncated under it,
// which would otherwise raise SIGBUS on the next touch of a lost page, in Go code or in a C
// plugin computing from the mapped weights alike, and kill the process. The guard is a read
// lease (fcntl F_SETLEASE) on the open file: a writer's open for writing or truncate blocks in
// the kernel while this process is sent SIGIO; the handler copies the image into private
// anonymous memory and moves that over the mapping's address with mremap, so every pointer
// into the weights stays valid and reads the same bytes, then releases the lease and the
// writer proceeds. The File is then Detached: consistent, but no longer the file on disk.
//
// Not covered: a file this process may not lease (another user's file without CAP_LEASE, a
// filesystem without leases such as NFS, a file some process already holds open for writing)
// keeps a plain mapping (Protected reports false); a writer that waits out the kernel's
// lease-break-time (/proc/sys/fs/lease-break-time, 45 s by default) before the copy finishes.
// Replacing the file by rename never needed the guard: the old inode stays mapped.

// leased is a guarded mapping.
type leased struct {
	fd       int // a dup of the opened file: the lease lives on its open file description
	addr     unsafe.Pointer
	size     uintptr
	mu       sync.Mutex
	closed   bool
	detached atomic.Bool
}

var leases struct {
	sync.Mutex
	set  map[*leased]struct{}
	once sync.Once
}

func mapFile(fd *os.File, size int64) (*mapping, error) {
	if size == 0 {
		return &mapping{release: func() error { return nil }}, nil
	}
	addr, err := unix.MmapPtr(int(fd.Fd()), 0, nil, uintptr(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	data := unsafe.Slice((*byte)(addr), size)
	l := &leased{fd: -1, addr: addr, size: uintptr(size)}
	m := &mapping{data: data, release: l.close, detached: l.detached.Load}
	dup, err := unix.FcntlInt(fd.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		slog.Debug("gguf: no lease on the mapped file", "file", fd.Name(), "err", err)
		return m, nil
	}
	leases.once.Do(watchLeaseBreaks)
	leases.Lock()
	if _, err := unix.FcntlInt(uintptr(dup), unix.F_SETLEASE, unix.F_RDLCK); err != nil {
		leases.Unlock()
		slog.Debug("gguf: no lease on the mapped file: overwriting it would fault the mapping", "file", fd.Name(), "err", err)
		l.fd = dup // kept for Check's fstat
		m.check = statCheck(dup, fd.Name())
		return m, nil
	}
	l.fd = dup
	if leases.set == nil {
		leases.set = map[*leased]struct{}{}
	}
	leases.set[l] = struct{}{}
	leases.Unlock()
	m.protected = true
	return m, nil
}

// watchLeaseBreaks starts the SIGIO handler: a lease break is sent as SIGIO to the process
// (the kernel does not say which file through os/signal), so every lease is checked.
func watchLeaseBreaks() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, unix.SIGIO)
	go func() {
		for range ch {
			leases.Lock()
			var broken []*leased
			for l := range leases.set {
				// while a break is pending, F_GETLEASE returns the type the lease must drop to
				if t, err := unix.FcntlInt(uintptr(l.fd), unix.F_GETLEASE, 0); err != nil || t != unix.F_RDLCK {
					broken = append(broken, l)
				}
			}
			leases.Unlock()
			for _, l := range broken {
				l.detach()
			}
		}
	}()
}

// detach copies the image into anonymous memory at the same address and lets the lease go.
func (l *leased) detach() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.detached.Load() {
		return
	}
	err := l.privatize()
	if err != nil {
		slog.Warn("gguf: the mapped file is being overwritten and could not be copied: reading its weights may fault", "err", err)
	}
	l.detached.Store(err == nil)
	l.unlease()
}

func (l *leased) privatize() error {
	// shared anonymous memory, not private: a plugin that repacked a weight hands the file's
	// pages back with MADV_DONTNEED where the mapping is shared, which on shared memory keeps
	// the bytes (a later read faults them back) and on private memory would zero them; the
	// copy may replace the file's pages between the plugin's look at the mapping and its madvise
	anon, err := unix.MmapPtr(-1, 0, nil, l.size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	copy(unsafe.Slice((*byte)(anon), l.size), unsafe.Slice((*byte)(l.addr), l.size))
	if err := unix.Mprotect(unsafe.Slice((*byte)(anon), l.size), unix.PROT_READ); err != nil {
		_ = unix.MunmapPtr(anon, l.size)
		return err
	}
	// atomically replaces the file pages at l.addr by the copy: readers see the same bytes
	if _, err := unix.MremapPtr(anon, l.size, l.addr, l.size, unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED); err != nil {
		_ = unix.MunmapPtr(anon, l.size)
		return err
	}
	return nil
}

// unlease releases the lease (the writer goes on) and forgets the file.
func (l *leased) unlease() {
	if l.fd < 0 {
		return
	}
	// F_UNLCK on a descriptor that holds no lease is harmless
	leases.Lock()
	delete(leases.set, l)
	leases.Unlock()
	_, _ = unix.FcntlInt(uintptr(l.fd), unix.F_SETLEASE, unix.F_UNLCK)
	_ = unix.Close(l.fd)
	l.fd = -1
}

func (l *leased) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	l.unlease()
	return unix.MunmapPtr(l.addr, l.size)
}
