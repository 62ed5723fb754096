//go:build unix

package energy

import (
	"fmt"
	"syscall"
	"time"
)

// ProcessCPUTime is the user plus system CPU time this process has used (getrusage
// RUSAGE_SELF, every thread, the plugins' worker threads included).
func ProcessCPUTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("energy: getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
