package loader

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// futex(2) operations (golang.org/x/sys/unix has the call but not these).
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexWait sleeps while *addr == val, for at most d (d < 0: no limit). Wake-ups can be
// spurious: callers re-check.
func futexWait(addr *uint32, val uint32, d time.Duration) {
	var ts *unix.Timespec
	if d >= 0 {
		t := unix.NsecToTimespec(int64(d))
		ts = &t
	}
	// not FUTEX_PRIVATE_FLAG: the word is shared with the other process
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val),
		uintptr(unsafe.Pointer(ts)), 0, 0)
}

// futexWake wakes the sleepers on addr.
func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, 1<<30, 0, 0, 0)
}

// recvCloexec makes received fds close-on-exec atomically.
const recvCloexec = unix.MSG_CMSG_CLOEXEC

// markCloexec: nothing to do, recvCloexec did it.
func markCloexec([]int) {}

// fdSocketPair is the host–child socket that carries buffer fds: message boundaries kept.
func fdSocketPair() ([2]int, error) {
	return unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
}
