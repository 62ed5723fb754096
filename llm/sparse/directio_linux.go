//go:build linux

package sparse

import (
	"errors"
	"os"
	"syscall"

	"github.com/xpuhub/xpu/internal/safefile"
)

// openDirect opens path for reads that bypass the page cache (O_DIRECT): cold neurons are read
// once per miss, caching them twice (page cache and bundle cache) would spend the budget twice.
// Filesystems without direct I/O (tmpfs, some FUSE) refuse with EINVAL.
func openDirect(path string) (*os.File, error) {
	return safefile.OpenFile(path, syscall.O_DIRECT)
}

// directRefused says whether a direct read failed because the file or buffer does not allow
// direct I/O (rather than an I/O error): the reader then falls back to buffered reads.
func directRefused(err error) bool { return errors.Is(err, syscall.EINVAL) }
