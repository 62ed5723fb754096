package hostsync

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/core"
)

// WithThreadAffinity runs f on an OS thread restricted to cpus, then restores the thread's
// mask. Threads that f's callee starts inherit the mask: opening the opencl plugin (PoCL's CPU
// device starts its worker threads, one per CPU of the mask, when the platform is enumerated)
// inside it pins that device to cpus, which no context option can do afterwards.
func WithThreadAffinity(cpus []int, f func() error) error {
	if len(cpus) == 0 {
		return fmt.Errorf("thread affinity: no cpus: %w", core.ErrInvalidArgument)
	}
	var set unix.CPUSet
	for _, c := range cpus {
		if c < 0 || c >= len(set)*64 {
			return fmt.Errorf("thread affinity: cpu %d: %w", c, core.ErrInvalidArgument)
		}
		set.Set(c)
	}
	runtime.LockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("thread affinity: %w", err)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("thread affinity %v: %w", cpus, err)
	}
	ferr := f()
	if err := unix.SchedSetaffinity(0, &old); err != nil {
		// the thread keeps the narrow mask: it stays locked to this goroutine (and ends with
		// it) rather than going back to the Go scheduler's pool
		return fmt.Errorf("thread affinity: restore: %w", err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// PinThread restricts the calling OS thread (the caller has locked its goroutine to it with
// runtime.LockOSThread) to cpus, for good: a scheduler's worker pinned to its unit's cores
// runs that unit's small partitions on its own thread (the neon plugin runs a one-thread
// executable inline when the caller already sits on its one CPU) and may spin on another
// unit's signal without taking a core from anyone it waits for.
func PinThread(cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		if c < 0 || c >= len(set)*64 {
			return fmt.Errorf("thread affinity: cpu %d: %w", c, core.ErrInvalidArgument)
		}
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("thread affinity %v: %w", cpus, err)
	}
	return nil
}

// ThreadCPUs is the calling OS thread's CPU mask (lock the goroutine to its thread first for
// the answer to stay true).
func ThreadCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("thread affinity: %w", err)
	}
	var out []int
	for c := range len(set) * 64 {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out, nil
}
