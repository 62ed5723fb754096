//go:build !linux

package hostsync

import "time"

// newParker: without futexes, consumers block on a channel.
func newParker() parker { return &chanParker{} }

// nanosleep does nothing where no sub-millisecond sleep is known to be available (Go's
// time.Sleep rounds up to about 1 ms): Wait then goes straight to its spin and blocking phases,
// which stay correct, only without the predicted sleep.
func nanosleep(time.Duration) {}
