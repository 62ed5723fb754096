package sched

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReserveProcs(t *testing.T) {
	orig := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(orig) })
	tests := []struct {
		name    string
		start   int   // GOMAXPROCS before
		reserve []int // workers of each runtime opened in turn
		want    []int // GOMAXPROCS after each reservation
	}{
		{"enough already", 8, []int{2}, []int{8}},
		{"two workers on two procs", 2, []int{2}, []int{3}},
		{"one worker on one proc", 1, []int{1}, []int{2}},
		{"two runtimes add up", 2, []int{2, 2}, []int{3, 5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GOMAXPROCS(tc.start)
			var rels []func()
			for i, n := range tc.reserve {
				rels = append(rels, reserveProcs(n))
				assert.Equal(t, tc.want[i], runtime.GOMAXPROCS(0), "after reservation %d", i)
			}
			// released in reverse: each step goes back to what the remaining ones need
			for i := len(rels) - 1; i > 0; i-- {
				rels[i]()
				rels[i]() // idempotent
				assert.Equal(t, tc.want[i-1], runtime.GOMAXPROCS(0), "after release %d", i)
			}
			rels[0]()
			if tc.start >= tc.reserve[0]+1 && len(tc.reserve) == 1 {
				assert.Equal(t, tc.start, runtime.GOMAXPROCS(0), "never raised, never touched")
			}
			procHeadroom.mu.Lock()
			defer procHeadroom.mu.Unlock()
			assert.Zero(t, procHeadroom.workers)
			assert.False(t, procHeadroom.raised)
		})
	}
}

// A value set by someone else while the headroom is held stands after the release.
func TestReserveProcsKeepsForeignSetting(t *testing.T) {
	orig := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(orig) })
	runtime.GOMAXPROCS(2)
	rel := reserveProcs(2)
	require.Equal(t, 3, runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(6)
	rel()
	assert.Equal(t, 6, runtime.GOMAXPROCS(0))
}
