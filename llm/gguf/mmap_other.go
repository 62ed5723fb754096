//go:build !unix

package gguf

import (
	"io"
	"os"
)

// mapFile reads the file where mmap is unavailable; the rest of the package is the same.
// A copy cannot be faulted by a writer: the File is Protected.
func mapFile(fd *os.File, size int64) (*mapping, error) {
	data := make([]byte, size)
	if _, err := io.ReadFull(fd, data); err != nil {
		return nil, err
	}
	return &mapping{data: data, release: func() error { return nil }, protected: true}, nil
}
