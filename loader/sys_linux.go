package loader

import (
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
