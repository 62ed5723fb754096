//go:build !unix

package safefile

import "os"

// openNonblock has no non-blocking open to use here: it refuses a path that stats as anything
// but a regular file before opening it (the check and the open can race; unix builds do not).
func openNonblock(path string, flag int) (*os.File, error) {
	if err := Check(path); err != nil {
		return nil, err
	}
	return os.OpenFile(path, os.O_RDONLY|flag, 0)
}
