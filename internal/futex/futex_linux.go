package futex

import (
	"math"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// futex(2) operations (linux/futex.h; golang.org/x/sys/unix has the call but not these).
const (
	opWait    = 0
	opWake    = 1
	opPrivate = 128
)

// Native reports whether Wait blocks in the kernel (true) or polls.
const Native = true

func (s Scope) flag() uintptr {
	if s == Private {
		return opPrivate
	}
	return 0
}

// Wait sleeps while *addr == val, for at most d (d < 0: no limit). Wake-ups can be spurious and
// EAGAIN, EINTR and ETIMEDOUT all return: callers re-check the word.
func Wait(addr *uint32, val uint32, d time.Duration, s Scope) {
	var ts *unix.Timespec
	if d >= 0 {
		t := unix.NsecToTimespec(int64(d))
		ts = &t
	}
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), opWait|s.flag(), uintptr(val),
		uintptr(unsafe.Pointer(ts)), 0, 0)
}

// Wake wakes every sleeper on addr.
func Wake(addr *uint32, s Scope) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), opWake|s.flag(), math.MaxInt32, 0, 0, 0)
}
