//go:build !linux

package hostsync

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// WithThreadAffinity needs Linux's sched_setaffinity.
func WithThreadAffinity(cpus []int, f func() error) error {
	return fmt.Errorf("thread affinity: %w", core.ErrUnsupported)
}

// PinThread needs Linux's sched_setaffinity.
func PinThread(cpus []int) error {
	return fmt.Errorf("thread affinity: %w", core.ErrUnsupported)
}

// ThreadCPUs needs Linux's sched_getaffinity.
func ThreadCPUs() ([]int, error) {
	return nil, fmt.Errorf("thread affinity: %w", core.ErrUnsupported)
}
