//go:build unix && !linux

package loader

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/internal/futex"
)

// futexWait polls *addr for at most d (d < 0: no limit): there is no futex here.
func futexWait(addr *uint32, val uint32, d time.Duration) { futex.Wait(addr, val, d, futex.Shared) }

// futexWake: the waiters poll.
func futexWake(addr *uint32) { futex.Wake(addr, futex.Shared) }

// recvCloexec: the flag is Linux's; markCloexec sets it after the fact.
const recvCloexec = 0

func markCloexec(fds []int) {
	for _, fd := range fds {
		unix.CloseOnExec(fd)
	}
}

// fdSocketPair: datagram sockets keep message boundaries where AF_UNIX has no SOCK_SEQPACKET
// (darwin).
func fdSocketPair() ([2]int, error) {
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		return p, err
	}
	unix.CloseOnExec(p[0])
	unix.CloseOnExec(p[1])
	return p, nil
}
