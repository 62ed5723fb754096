//go:build !unix

package energy

import (
	"fmt"
	"time"
)

// ProcessCPUTime is not available on this platform.
func ProcessCPUTime() (time.Duration, error) {
	return 0, fmt.Errorf("energy: process CPU time: %w", ErrNoMeter)
}
