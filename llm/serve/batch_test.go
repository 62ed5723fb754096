package serve

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParallelBatches: with several slots the server's runners are one batch: concurrent
// streams each carry their own greedy text and their decodes share steps; WithoutBatching
// keeps a runner per slot.
func TestParallelBatches(t *testing.T) {
	prompts := []string{"Lily", "Tom", "a dog", "the sun"}
	tests := []struct {
		name    string
		opts    []Option
		batched bool
	}{
		{"batched", []Option{WithParallel(len(prompts))}, true},
		{"without batching", []Option{WithParallel(2), WithoutBatching()}, false},
		{"one slot", []Option{WithParallel(1)}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hs, srv := newTestServer(t, tc.opts...)
			require.Equal(t, tc.batched, srv.batch != nil)
			if !tc.batched {
				return
			}
			want := map[string]string{}
			for _, p := range prompts {
				want[p], _, _ = streamChat(t, hs.URL, chatBody("Tell me about "+p+".", 24, true))
			}
			before := srv.batch.Stats()
			var wg sync.WaitGroup
			got := make([]string, len(prompts))
			for i, p := range prompts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got[i], _, _ = streamChat(t, hs.URL, chatBody("Tell me about "+p+".", 24, true))
				}()
			}
			wg.Wait()
			for i, p := range prompts {
				assert.Equal(t, want[p], got[i], p)
			}
			st := srv.batch.Stats()
			steps, rows := st.Steps-before.Steps, st.Rows-before.Rows
			assert.Greater(t, float64(rows)/float64(steps), 1.5, "concurrent decodes share steps (%d rows in %d steps)", rows, steps)
		})
	}
}
