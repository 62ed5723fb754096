package serve

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm"
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
		msgs := []llm.Message{{Role: "user", Content: "Tell me a story."}}
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
