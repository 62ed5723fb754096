package gguf

import (
	"errors"
	"fmt"

	"github.com/xpuhub/xpu/internal/safefile"
)

// Open maps a GGUF file read-only and parses it. Tensor data stays in the mapping (no copy)
// until Close.
func Open(path string) (*File, error) {
	fd, err := safefile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	m, err := mapFile(fd, st.Size())
	if err != nil {
		return nil, fmt.Errorf("gguf: map %s: %w", path, err)
	}
	f, err := Parse(m.data)
	if err != nil {
		_ = m.release()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.release, f.detached, f.protected, f.check = m.release, m.detached, m.protected, m.check
	return f, nil
}

// mapping is an opened file's image and how to let go of it.
type mapping struct {
	data    []byte
	release func() error
	// detached reports the image moved to private memory (nil: never)
	detached func() bool
	// protected: overwriting the file cannot fault the image
	protected bool
	// check reports an unprotected image whose file changed (nil: nothing to check)
	check func() error
}

// ErrChanged is returned by Check for a file overwritten under an unprotected File.
var ErrChanged = errors.New("file changed on disk")

// Check reports (ErrChanged) a file overwritten or truncated on disk under a File that is not
// Protected, before anything reads the image and faults: callers check before each use (an
// inference request) and reopen. A Protected File is never in error: after an overwrite it reads
// its private copy (Detached). A write that lands while the image is being read is not caught
// here: only the lease (Protected) covers that.
func (f *File) Check() error {
	if f.check == nil || f.Protected() {
		return nil
	}
	return f.check()
}

// Detached reports whether the file was overwritten or truncated under this File: its image
// was then copied into private memory first, so the File stays valid and reads the bytes it
// was opened with, but it no longer matches the file on disk (reopen it to see the new one).
func (f *File) Detached() bool { return f.detached != nil && f.detached() }

// Protected reports whether overwriting the file on disk leaves this File intact (Linux, with a
// read lease on the file: see mmap_linux.go) rather than faulting the process on its next read
// of the image. A File from Parse is always protected (the caller owns the bytes).
func (f *File) Protected() bool { return f.release == nil || f.protected }
