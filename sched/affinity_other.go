//go:build !linux

package sched

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// WithThreadAffinity needs Linux's sched_setaffinity.
func WithThreadAffinity(cpus []int, f func() error) error {
	return fmt.Errorf("thread affinity: %w", core.ErrUnsupported)
}

// pinThread needs Linux's sched_setaffinity.
func pinThread(cpus []int) error {
	return fmt.Errorf("thread affinity: %w", core.ErrUnsupported)
}
