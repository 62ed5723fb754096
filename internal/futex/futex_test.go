package futex

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWaitReturnsWhenTheWordMoved(t *testing.T) {
	for _, s := range []Scope{Private, Shared} {
		var w uint32
		done := make(chan struct{})
		go func() {
			for atomic.LoadUint32(&w) == 0 {
				Wait(&w, 0, -1, s)
			}
			close(done)
		}()
		time.Sleep(10 * time.Millisecond)
		atomic.StoreUint32(&w, 1)
		Wake(&w, s)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("scope %d: the waiter never woke", s)
		}
	}
}

func TestWaitTimesOut(t *testing.T) {
	var w uint32
	start := time.Now()
	Wait(&w, 0, 20*time.Millisecond, Private)
	require.Less(t, time.Since(start), 5*time.Second)
}

func TestWaitOnAChangedWordReturnsAtOnce(t *testing.T) {
	w := uint32(7)
	start := time.Now()
	Wait(&w, 3, -1, Private) // *addr != val: nothing to wait for
	require.Less(t, time.Since(start), 5*time.Second)
}
