//go:build !unix

package gguf

import (
	"io"
	"os"
)

// mapFile reads the file where mmap is unavailable; the rest of the package is the same.
func mapFile(fd *os.File, size int64) ([]byte, func() error, error) {
	data := make([]byte, size)
	if _, err := io.ReadFull(fd, data); err != nil {
		return nil, nil, err
	}
	return data, func() error { return nil }, nil
}
