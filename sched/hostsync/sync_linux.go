package hostsync

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/internal/futex"
)

// futexParker blocks on the word itself: no lock, no allocation, and a wake-up that costs the
// producer one system call only when a consumer is really blocked.
type futexParker struct{}

func newParker() parker { return futexParker{} }

func (futexParker) park(word *atomic.Uint32, val uint32, timeout time.Duration) {
	if timeout <= 0 {
		timeout = -1 // no limit
	}
	// EAGAIN (the word moved), EINTR and ETIMEDOUT all mean "re-check": the caller loops.
	futex.Wait((*uint32)(unsafe.Pointer(word)), val, timeout, futex.Private)
}

func (futexParker) unpark(word *atomic.Uint32) {
	futex.Wake((*uint32)(unsafe.Pointer(word)), futex.Private)
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
