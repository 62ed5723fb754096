package gguf

import (
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
	data, release, err := mapFile(fd, st.Size())
	if err != nil {
		return nil, fmt.Errorf("gguf: map %s: %w", path, err)
	}
	f, err := Parse(data)
	if err != nil {
		_ = release()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.release = release
	return f, nil
}
