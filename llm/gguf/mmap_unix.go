//go:build unix && !linux

package gguf

import (
	"os"

	"golang.org/x/sys/unix"
)

// mapFile maps the file shared and read-only. Overwriting the file under the mapping faults it
// (SIGBUS); only Linux guards against that (mmap_linux.go).
func mapFile(fd *os.File, size int64) (*mapping, error) {
	if size == 0 {
		return &mapping{release: func() error { return nil }}, nil
	}
	data, err := unix.Mmap(int(fd.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	m := &mapping{data: data, release: func() error { return unix.Munmap(data) }}
	if dup, err := unix.FcntlInt(fd.Fd(), unix.F_DUPFD_CLOEXEC, 0); err == nil {
		m.check = statCheck(dup, fd.Name())
		m.release = func() error {
			_ = unix.Close(dup)
			return unix.Munmap(data)
		}
	}
	return m, nil
}
