//go:build unix

package gguf

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// statCheck returns Check for an unguarded mapping of the file open as fd: the file's size and
// modification time, taken now, must not change.
func statCheck(fd int, name string) func() error {
	var st0 unix.Stat_t
	if unix.Fstat(fd, &st0) != nil {
		return nil
	}
	return func() error {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("gguf: %s: %w", name, err)
		}
		if st.Size != st0.Size || st.Mtim != st0.Mtim {
			return fmt.Errorf("gguf: %s was overwritten since it was opened (%d bytes, now %d): reading its weights could crash the process, reopen it: %w",
				name, st0.Size, st.Size, ErrChanged)
		}
		return nil
	}
}
