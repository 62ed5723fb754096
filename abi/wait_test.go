package abi

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWaitSliced(t *testing.T) {
	boom := errors.New("boom")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	near, cancelNear := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancelNear()
	for _, tc := range []struct {
		name      string
		ctx       context.Context
		doneAfter int   // calls before wait reports done; -1: never
		result    error // what wait returns when done
		want      error
		maxSlice  time.Duration
	}{
		{"done at once", context.Background(), 1, nil, nil, fenceSlice},
		{"error after timeouts", context.Background(), 3, boom, boom, fenceSlice},
		{"cancelled before the first call", cancelled, -1, nil, context.Canceled, 0},
		{"deadline bounds the slice", near, -1, nil, context.DeadlineExceeded, 5 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := WaitSliced(tc.ctx, func(slice time.Duration) (bool, error) {
				calls++
				assert.LessOrEqual(t, slice, tc.maxSlice)
				assert.GreaterOrEqual(t, slice, time.Duration(0))
				if calls == tc.doneAfter {
					return true, tc.result
				}
				time.Sleep(slice)
				return false, nil
			})
			require.ErrorIs(t, err, tc.want)
			if tc.want == nil {
				require.NoError(t, err)
			}
			if tc.doneAfter > 0 {
				assert.Equal(t, tc.doneAfter, calls)
			}
			if tc.ctx == cancelled {
				assert.Zero(t, calls)
			}
		})
	}
}
