//go:build unix

package conformance

import "golang.org/x/sys/unix"

// hostMemory maps n bytes of anonymous memory: page-aligned, outside the Go heap, so a plugin
// may keep its address for the imported buffer's lifetime.
func hostMemory(n int) ([]byte, func(), error) {
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, err
	}
	return mem, func() { _ = unix.Munmap(mem) }, nil
}
