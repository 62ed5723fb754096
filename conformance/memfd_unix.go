//go:build unix

package conformance

import (
	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/internal/shmem"
)

// memfdMemory makes an n-byte shared-memory fd (a memfd on Linux) and maps it shared, so the host sees what a backend that
// imported the fd writes.
func memfdMemory(n int) (int, []byte, func(), error) {
	fd, err := shmem.NewFD("xpu-conformance", int64(n), shmem.Options{})
	if err != nil {
		return -1, nil, nil, err
	}
	mem, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return -1, nil, nil, err
	}
	return fd, mem, func() { _ = unix.Munmap(mem); _ = unix.Close(fd) }, nil
}
