//go:build unix && !linux

package loader

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// pollSlice bounds one sleep of futexWait where there is no futex (darwin, the BSDs): the
// waiter re-reads the shared word this often, so an isolated call's wake-up costs up to this
// much more latency than on Linux.
const pollSlice = 50 * time.Microsecond

// futexWait polls *addr for at most d (d < 0: no limit) in short sleeps; it returns when the
// word moves or the time is up. Callers re-check, as they do after a futex wake-up.
func futexWait(addr *uint32, val uint32, d time.Duration) {
	deadline := time.Now().Add(d)
	for atomic.LoadUint32(addr) == val {
		if d >= 0 && !time.Now().Before(deadline) {
			return
		}
		time.Sleep(pollSlice)
	}
}

// futexWake: the waiters poll.
func futexWake(*uint32) {}

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

// statKey is "" here: cache entries are always checked against the file's contents.
func statKey(string) string { return "" }
