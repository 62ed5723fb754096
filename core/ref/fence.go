package ref

import (
	"context"
	"errors"
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// fence is a timeline semaphore: a value that only grows; waiters wake when it reaches theirs.
type fence struct {
	handle
	value   uint64
	changed chan struct{} // closed and replaced on every signal and on Close
}

func newFence(initial uint64) *fence { return &fence{value: initial, changed: make(chan struct{})} }

func (f *fence) Wait(ctx context.Context, value uint64) error {
	for {
		f.mu.Lock()
		v, closed, ch := f.value, f.closed, f.changed
		f.mu.Unlock()
		if v >= value {
			return nil
		}
		if closed {
			return fmt.Errorf("ref: fence closed while waiting for %d: %w", value, core.ErrInvalidHandle)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			err := ctx.Err()
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("ref: fence wait for %d (at %d): %w: %w", value, v, core.ErrTimeout, err)
			}
			return fmt.Errorf("ref: fence wait for %d (at %d): %w", value, v, err)
		}
	}
}

func (f *fence) Value() (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, fmt.Errorf("ref: fence is closed: %w", core.ErrInvalidHandle)
	}
	return f.value, nil
}

// Signal advances the timeline; a value not above the current one is refused.
func (f *fence) Signal(value uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return fmt.Errorf("ref: fence is closed: %w", core.ErrInvalidHandle)
	}
	if value <= f.value {
		return fmt.Errorf("ref: fence signal %d does not advance the timeline (at %d): %w", value, f.value, core.ErrInvalidArgument)
	}
	f.value = value
	close(f.changed)
	f.changed = make(chan struct{})
	return nil
}

// Close wakes every waiter with ErrInvalidHandle.
func (f *fence) Close() error {
	return f.closeOnce("fence", func() error { close(f.changed); return nil })
}
