package loader

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/internal/futex"
)

// futexWait sleeps while *addr == val, for at most d (d < 0: no limit); the word is shared
// with the other process.
func futexWait(addr *uint32, val uint32, d time.Duration) { futex.Wait(addr, val, d, futex.Shared) }

// futexWake wakes the sleepers on addr.
func futexWake(addr *uint32) { futex.Wake(addr, futex.Shared) }

// recvCloexec makes received fds close-on-exec atomically.
const recvCloexec = unix.MSG_CMSG_CLOEXEC

// markCloexec: nothing to do, recvCloexec did it.
func markCloexec([]int) {}

// fdSocketPair is the host–child socket that carries buffer fds: message boundaries kept.
func fdSocketPair() ([2]int, error) {
	return unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
}

// statKey names one version of the file at path without reading it: device, inode, size and
// the modification and change times to the nanosecond. Writing the file moves its change time
// (which no system call sets back), replacing it changes the inode, so a cache entry made
// under the same statKey is the entry of these very bytes.
func statKey(path string) string {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return ""
	}
	return fmt.Sprintf("%d:%d %d %d.%09d %d.%09d", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec,
		st.Ctim.Sec, st.Ctim.Nsec)
}
