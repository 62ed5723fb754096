package serve

import (
	"net/http"
	"strings"
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

// With n > 1 on a batched server the choices run at once on free runners, sharing steps, and
// are the choices a one-runner server generates one after another (the same seeds); streamed,
// every choice streams its text and finishes.
func TestChoicesBatched(t *testing.T) {
	one, _ := newTestServer(t, WithMaxTokens(64))
	hs, srv := newTestServer(t, WithMaxTokens(64), WithParallel(4))
	require.NotNil(t, srv.batch)
	for _, tc := range []struct {
		name, path, body string
	}{
		{"chat", "/v1/chat/completions", `{"model":"stories","n":3,"seed":5,"temperature":1,"max_tokens":16,"messages":[{"role":"user","content":"Once upon a time"}]}`},
		{"completions", "/v1/completions", `{"model":"stories","n":4,"seed":2,"temperature":1,"max_tokens":16,"logprobs":1,"prompt":"Tom had"}`},
		{"more choices than runners", "/v1/completions", `{"model":"stories","n":6,"seed":9,"temperature":1,"max_tokens":8,"prompt":"A cat"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, wu := postChoices(t, one.URL+tc.path, tc.body)
			before := srv.batch.Stats()
			got, gu := postChoices(t, hs.URL+tc.path, tc.body)
			require.Len(t, got, len(want))
			for i := range want {
				assert.Equal(t, i, got[i].Index)
				assert.Equal(t, want[i].Text, got[i].Text, "choice %d", i)
				assert.Equal(t, want[i].Message, got[i].Message, "choice %d", i)
				if want[i].Logprobs != nil {
					// a step of several rows rounds its sums in another order
					require.NotNil(t, got[i].Logprobs)
					assert.Equal(t, want[i].Logprobs.Tokens, got[i].Logprobs.Tokens)
					assert.InDeltaSlice(t, want[i].Logprobs.TokenLogprobs, got[i].Logprobs.TokenLogprobs, 1e-3)
				}
			}
			assert.Equal(t, wu, gu)
			st := srv.batch.Stats()
			// a loaded machine lets some choices miss a step, so the bar is sharing, not full width
			assert.Greater(t, float64(st.Rows-before.Rows)/float64(st.Steps-before.Steps), 1.2, "the choices share steps")
		})
	}
	t.Run("streamed", func(t *testing.T) {
		body := `{"model":"stories","stream":true,"n":3,"seed":1,"temperature":1,"max_tokens":8,"logprobs":true,"messages":[{"role":"user","content":"hi"}]}`
		texts := func(url string) map[int]string {
			resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			require.NoError(t, err)
			defer resp.Body.Close()
			events, done := readSSE(t, resp.Body)
			require.True(t, done)
			text, finished := map[int]string{}, map[int]bool{}
			for _, ev := range events {
				for _, c := range ev["choices"].([]any) {
					c := c.(map[string]any)
					i := int(c["index"].(float64))
					if d, ok := c["delta"].(map[string]any); ok {
						if s, ok := d["content"].(string); ok {
							text[i] += s
						}
					}
					if c["finish_reason"] != nil {
						finished[i] = true
					}
				}
			}
			assert.Equal(t, map[int]bool{0: true, 1: true, 2: true}, finished)
			return text
		}
		assert.Equal(t, texts(one.URL), texts(hs.URL))
	})
}
