package ref

import (
	"fmt"
	"sync"

	"github.com/xpuhub/xpu/core"
)

// handle is what every object of the reference backend that can be closed shares: a lock over
// its state and whether it is closed.
type handle struct {
	mu     sync.Mutex
	closed bool
}

// closeOnce closes the handle under its lock: release runs first (its error leaves the handle
// open), then the handle is marked closed. A second close is ErrInvalidHandle, naming what.
func (h *handle) closeOnce(what string, release func() error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return fmt.Errorf("ref: %s closed twice: %w", what, core.ErrInvalidHandle)
	}
	if err := release(); err != nil {
		return err
	}
	h.closed = true
	return nil
}
