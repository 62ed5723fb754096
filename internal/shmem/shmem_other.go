//go:build unix && !linux

package shmem

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

func newFD(name string, size int64, o Options) (int, error) {
	if o.Sealed {
		return -1, ErrNoSeals
	}
	f, err := os.CreateTemp("", name+"-*")
	if err != nil {
		return -1, fmt.Errorf("shared memory file: %w", err)
	}
	defer f.Close()
	// unlinked at once: the memory lives as long as an fd or a mapping does, like a memfd
	if err := os.Remove(f.Name()); err != nil {
		return -1, fmt.Errorf("shared memory file: %w", err)
	}
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		return -1, fmt.Errorf("shared memory file: dup: %w", err)
	}
	unix.CloseOnExec(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("shared memory file of %d bytes: %w", size, err)
	}
	return fd, nil
}
