// Package safefile opens the files a user or a cache names (models, plans, profiles,
// calibrations, sidecars, cache records) for reading without ever blocking on them: a FIFO, a
// character device or a socket at such a path would make a plain open or read wait forever for
// a writer, so it is opened non-blocking, checked with fstat and refused unless it is a regular
// file. Every reader of such a path goes through Open or ReadFile.
package safefile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/xpuhub/xpu/core"
)

// ErrNotRegular is returned (wrapped, with the path and the kind of file found) for a path that
// exists but is not a regular file: a FIFO, a device, a socket or a directory. It also matches
// core.ErrInvalidArgument.
var ErrNotRegular = fmt.Errorf("not a regular file: %w", core.ErrInvalidArgument)

// Open opens path read-only. It never blocks on a FIFO or a device: anything but a regular file
// is closed again and refused with ErrNotRegular. Errors from the open itself are *fs.PathError,
// so errors.Is(err, fs.ErrNotExist) holds for a missing file. The file returned is in blocking
// mode, as os.Open's.
func Open(path string) (*os.File, error) { return OpenFile(path, 0) }

// OpenFile is Open with extra open(2) flags (O_DIRECT, for one) added to the read-only ones.
func OpenFile(path string, flag int) (*os.File, error) {
	f, err := openNonblock(path, flag)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		_ = f.Close()
		return nil, notRegular(path, st.Mode())
	}
	return f, nil
}

// ReadFile is os.ReadFile through Open.
func ReadFile(path string) ([]byte, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// Check reports ErrNotRegular for a path that exists and is not a regular file, without
// opening it (a FIFO is never opened); a missing path is not an error here: the caller's own
// open reports it.
func Check(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	if !st.Mode().IsRegular() {
		return notRegular(path, st.Mode())
	}
	return nil
}

func notRegular(path string, m fs.FileMode) error {
	return fmt.Errorf("%s: %s, %w", path, kind(m), ErrNotRegular)
}

// kind names a file type the way a user would look for it in ls -l.
func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m.IsDir():
		return "a directory"
	}
	return "a file of mode " + m.String()
}
