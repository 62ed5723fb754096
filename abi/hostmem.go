package abi

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
	"unsafe"
)

// isFileBacked reports whether mem lies inside one file mapping of this process (mmap'd model
// weights). Such memory is outside the Go heap: it never moves, and it is freed only when its
// owner unmaps it, so a plugin may keep a pointer to it (zero-copy import). Go heap memory may
// be freed once unreferenced and is never imported.
func isFileBacked(mem []byte) bool {
	if len(mem) == 0 {
		return false
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return false
	}
	defer f.Close()
	start := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	return mapsContainFile(f, start, start+uintptr(len(mem)))
}

// mapsContainFile reads /proc/<pid>/maps lines ("lo-hi perms offset dev inode path") and
// reports whether [lo, hi) lies inside one mapping backed by a regular file.
func mapsContainFile(r io.Reader, lo, hi uintptr) bool {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 {
			continue // anonymous mapping
		}
		a, b, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		mlo, err1 := strconv.ParseUint(a, 16, 64)
		mhi, err2 := strconv.ParseUint(b, 16, 64)
		if err1 != nil || err2 != nil || mhi < mlo {
			continue
		}
		if uint64(lo) < mlo || uint64(hi) > mhi {
			continue
		}
		path := strings.Join(fields[5:], " ")
		inode, err := strconv.ParseUint(fields[4], 10, 64)
		return err == nil && inode != 0 && strings.HasPrefix(path, "/") && !strings.HasSuffix(path, "(deleted)")
	}
	return false
}
