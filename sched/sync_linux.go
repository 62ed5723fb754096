package sched

import (
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Linux futex operations (linux/futex.h); PRIVATE: the word is never shared with another process.
const (
	futexWait    = 0
	futexWake    = 1
	futexPrivate = 128
)

// futexParker blocks on the word itself: no lock, no allocation, and a wake-up that costs the
// producer one system call only when a consumer is really blocked.
type futexParker struct{}

func newParker() parker { return futexParker{} }

func (futexParker) park(word *atomic.Uint32, val uint32, timeout time.Duration) {
	var tsp *unix.Timespec
	if timeout > 0 {
		ts := unix.NsecToTimespec(int64(timeout))
		tsp = &ts
	}
	// EAGAIN (the word moved), EINTR and ETIMEDOUT all mean "re-check": the caller loops.
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWait|futexPrivate,
		uintptr(val), uintptr(unsafe.Pointer(tsp)), 0, 0)
}

func (futexParker) unpark(word *atomic.Uint32) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWake|futexPrivate,
		math.MaxInt32, 0, 0, 0)
}

// nanosleep sleeps d on the calling (locked) thread. It first sets the thread's timer slack to
// 1 ns: the default 50 µs slack alone would eat most of a sub-100 µs sleep. The setting stays
// with the thread, which only makes that thread's later timed waits more exact.
func nanosleep(d time.Duration) {
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	ts := unix.NsecToTimespec(int64(d))
	for unix.Nanosleep(&ts, &ts) == unix.EINTR { // the runtime's preemption signal interrupts
	}
}
