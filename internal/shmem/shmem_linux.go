package shmem

import (
	"fmt"

	"golang.org/x/sys/unix"
)

func newFD(name string, size int64, o Options) (int, error) {
	flags := unix.MFD_CLOEXEC
	if o.Sealed {
		flags |= unix.MFD_ALLOW_SEALING
	}
	fd, err := unix.MemfdCreate(name, flags)
	if err != nil {
		return -1, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("memfd of %d bytes: %w", size, err)
	}
	if o.Sealed {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("memfd seals: %w", err)
		}
	}
	return fd, nil
}
