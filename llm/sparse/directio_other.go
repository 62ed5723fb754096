//go:build !linux

package sparse

import (
	"fmt"
	"os"

	"github.com/xpuhub/xpu/core"
)

// openDirect: direct I/O is implemented for Linux only; elsewhere reads are buffered.
func openDirect(path string) (*os.File, error) {
	return nil, fmt.Errorf("sparse: direct I/O on %s: %w", path, core.ErrUnsupported)
}

func directRefused(error) bool { return false }
