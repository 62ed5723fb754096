//go:build unix

package safefile

import (
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// openNonblock opens with O_NONBLOCK, so that opening a FIFO with no writer returns at once,
// then puts the descriptor back in blocking mode for the regular file it will be.
func openNonblock(path string, flag int) (*os.File, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|flag, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		_ = unix.Close(fd)
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}
