//go:build unix

package sparse

import "golang.org/x/sys/unix"

// pinPages keeps b's pages in memory (mlock): a mapped file's pages then stay in the page cache
// however hard a memory limit presses, instead of being dropped and read again from disk.
func pinPages(b []byte) error { return unix.Mlock(b) }

// unpinPages undoes pinPages.
func unpinPages(b []byte) error { return unix.Munlock(b) }
