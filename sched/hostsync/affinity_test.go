package hostsync

import (
	"errors"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// TestWithThreadAffinity: f runs on a thread restricted to the cpus; the mask is restored.
func TestWithThreadAffinity(t *testing.T) {
	var inside []int
	err := WithThreadAffinity([]int{0}, func() error {
		var err error
		inside, err = ThreadCPUs()
		return err
	})
	if errors.Is(err, core.ErrUnsupported) {
		t.Skip(err)
	}
	require.NoError(t, err)
	assert.Equal(t, []int{0}, inside)
	require.ErrorIs(t, WithThreadAffinity(nil, func() error { return nil }), core.ErrInvalidArgument)
	require.ErrorIs(t, WithThreadAffinity([]int{-1}, func() error { return nil }), core.ErrInvalidArgument)
}

// TestPinThread: a pinned thread reports the pinned mask; bad CPUs are refused before the
// thread's mask changes.
func TestPinThread(t *testing.T) {
	tests := []struct {
		name string
		cpus []int
		want error
	}{
		{"cpu0", []int{0}, nil},
		{"negative", []int{-1}, core.ErrInvalidArgument},
		{"too large", []int{1 << 20}, core.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan struct{})
			go func() {
				defer close(done)
				// the thread ends with this goroutine (never unlocked), so its narrowed mask
				// does not leak back into the Go scheduler's pool
				runtime.LockOSThread()
				err := PinThread(tc.cpus)
				if errors.Is(err, core.ErrUnsupported) {
					return
				}
				if tc.want != nil {
					assert.ErrorIs(t, err, tc.want)
					return
				}
				if !assert.NoError(t, err) {
					return
				}
				got, err := ThreadCPUs()
				assert.NoError(t, err)
				assert.Equal(t, tc.cpus, got)
			}()
			<-done
		})
	}
}
