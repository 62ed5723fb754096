//go:build !linux

package futex

import (
	"sync/atomic"
	"time"
)

// Native reports whether Wait blocks in the kernel (true) or polls.
const Native = false

// pollSlice bounds one sleep of Wait where there is no futex (darwin, the BSDs): the waiter
// re-reads the word this often, so a wake-up costs up to this much more latency than on Linux.
const pollSlice = 50 * time.Microsecond

// Wait polls *addr for at most d (d < 0: no limit) in short sleeps; it returns when the word
// moves or the time is up. Callers re-check, as they do after a futex wake-up.
func Wait(addr *uint32, val uint32, d time.Duration, _ Scope) {
	deadline := time.Now().Add(d)
	for atomic.LoadUint32(addr) == val {
		if d >= 0 && !time.Now().Before(deadline) {
			return
		}
		time.Sleep(pollSlice)
	}
}

// Wake does nothing: the waiters poll.
func Wake(*uint32, Scope) {}
