package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/prompt"
)

// BenchmarkServe is one greedy 16-token chat completion over loopback HTTP (whole and
// streamed) next to the same generation called directly: the difference is the server's cost
// (HTTP, JSON, SSE, template, queue).
//
//	go test -run '^$' -bench BenchmarkServe -benchtime 200x ./llm/serve/
func BenchmarkServe(b *testing.B) {
	hs, srv := newTestServer(b)
	body := chatBody("Tell me a story.", 16, false)
	stream := chatBody("Tell me a story.", 16, true)
	b.Run("direct", func(b *testing.B) {
		sl := srv.slots.take(nil)
		defer srv.slots.put(sl)
		msgs := []prompt.Message{{Role: "user", Content: "Tell me a story."}}
		for b.Loop() {
			sl.chat.Reset()
			_, err := sl.chat.Complete(context.Background(), msgs, llm.WithMaxTokens(16))
			require.NoError(b, err)
		}
	})
	b.Run("http", func(b *testing.B) {
		for b.Loop() {
			code, out := post(b, hs.URL+"/v1/chat/completions", body)
			require.Equal(b, http.StatusOK, code, string(out))
		}
	})
	b.Run("http-stream", func(b *testing.B) {
		for b.Loop() {
			streamChat(b, hs.URL, stream)
		}
	})
}

// BenchmarkPromptCache is the time to the first token of a chat resent turn by turn: a
// 10-turn conversation sent to an empty cache ("cold", every token prefilled) against the same
// conversation with one more turn sent right after it ("warm", the runner's cache holds all but
// the new turn). XPU_SERVE_BENCH_MODEL names another model than stories260K.
//
//	go test -run '^$' -bench BenchmarkPromptCache -benchtime 5x ./llm/serve/
func BenchmarkPromptCache(b *testing.B) {
	path := os.Getenv("XPU_SERVE_BENCH_MODEL")
	if path == "" {
		path = storiesPath(b)
	}
	ctx := context.Background()
	eng, err := llm.Load(ctx, path, llm.WithReferenceFallback(), llm.WithRunnerOptions(llm.WithContextLength(1024)))
	require.NoError(b, err)
	b.Cleanup(func() { _ = eng.Close() })
	srv, err := New(ctx, eng, WithModelName("m"))
	require.NoError(b, err)
	b.Cleanup(func() { _ = srv.Close() })
	hs := httptest.NewServer(srv.Handler())
	b.Cleanup(hs.Close)
	var msgs []prompt.Message
	for i := range 10 {
		msgs = append(msgs, prompt.Message{Role: "user", Content: fmt.Sprintf("What happened on day %d?", i+1)},
			prompt.Message{Role: "assistant", Content: "The little dog ran to the park and played with a red ball."})
	}
	msgs = msgs[:len(msgs)-1] // ends with the tenth question
	next := append(slices.Clone(msgs), prompt.Message{Role: "assistant", Content: "It was sunny."},
		prompt.Message{Role: "user", Content: "And then?"})
	ttft := func(msgs []prompt.Message) (time.Duration, int) {
		body, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "temperature": 0, "messages": msgs})
		require.NoError(b, err)
		t0 := time.Now()
		code, out := post(b, hs.URL+"/v1/chat/completions", string(body))
		d := time.Since(t0)
		require.Equal(b, http.StatusOK, code, string(out))
		var resp struct {
			Usage usage `json:"usage"`
		}
		require.NoError(b, json.Unmarshal(out, &resp))
		return d, resp.Usage.PromptDetails.CachedTokens
	}
	var cold, warm time.Duration
	cached := 0
	for b.Loop() {
		srv.all[0].r.Reset()
		c, _ := ttft(msgs)
		w, n := ttft(next)
		cold, warm, cached = cold+c, warm+w, n
	}
	n := float64(b.N)
	b.ReportMetric(float64(cold.Milliseconds())/n, "cold-ms")
	b.ReportMetric(float64(warm.Milliseconds())/n, "warm-ms")
	b.ReportMetric(warm.Seconds()/cold.Seconds(), "warm/cold")
	b.ReportMetric(float64(cached), "cached-tokens")
}
