package sched

import (
	"os"
	"runtime"
	"sync"
)

// Why the runtime raises GOMAXPROCS (WithProcHeadroom):
//
// A unit's worker calls the backend through purego, which the Go runtime treats as a system
// call: the worker's P stays attached in the syscall state. Go's sysmon retakes a P that has
// been in a system call for one tick (20 µs) when no P is idle and no M spins, and hands it
// to a freshly woken thread that finds nothing to do and parks again. With GOMAXPROCS equal to
// the number of workers (two units on a 2-core machine) every backend call longer than 20 µs,
// which is every MATMUL part of a split decode, costs such a wake-up, and the woken thread
// runs on one of the cores the workers are pinned to: it preempts a worker in the middle of
// its part. On this machine a split decode took about 3,400 such wake-ups a second (the
// floating runtime thread's voluntary context switches) and about 2,000 preemptions a second
// of the core-0 worker, against a sixteenth of that with one unit, whose spare P keeps sysmon
// quiet. One idle P beside the workers is enough: sysmon then leaves a P in a system call alone
// for 10 ms.

// procHeadroom counts the workers of every open runtime that asked for headroom and raises
// GOMAXPROCS to one more than that when it is lower; the last release puts back the value
// found before the first raise (or the runtime's default, when it was not set explicitly).
var procHeadroom struct {
	mu      sync.Mutex
	workers int  // workers of the runtimes holding headroom
	raised  bool // GOMAXPROCS was changed by us
	orig    int  // GOMAXPROCS before the first raise
	set     int  // the value we last set
}

// reserveProcs adds n workers to the headroom count, raising GOMAXPROCS where it no longer
// leaves an idle P beside all of them, and returns the function that takes them off again
// (idempotent).
func reserveProcs(n int) (release func()) {
	h := &procHeadroom
	h.mu.Lock()
	defer h.mu.Unlock()
	h.workers += n
	cur := runtime.GOMAXPROCS(0)
	if want := h.workers + 1; cur < want {
		if !h.raised {
			h.raised, h.orig = true, cur
		}
		runtime.GOMAXPROCS(want)
		h.set = want
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.workers -= n
			if !h.raised || runtime.GOMAXPROCS(0) != h.set {
				// never raised, or someone else set it since: theirs stands
				if h.workers == 0 {
					h.raised = false
				}
				return
			}
			want := max(h.orig, h.workers+1)
			if h.workers == 0 {
				h.raised = false
				if os.Getenv("GOMAXPROCS") == "" {
					// back to the runtime's own default (and its automatic updates)
					runtime.SetDefaultGOMAXPROCS()
					return
				}
				want = h.orig
			}
			runtime.GOMAXPROCS(want)
			h.set = want
		})
	}
}
