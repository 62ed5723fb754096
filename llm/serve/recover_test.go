package serve

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/loader"
)

// isolatedServer serves the test model on the neon plugin in a child process and returns the
// server and the backend whose process the test kills.
func isolatedServer(t *testing.T, opts ...Option) (*httptest.Server, *Server, core.Backend) {
	t.Helper()
	ctx := context.Background()
	eng, err := llm.Load(ctx, storiesPath(t), llm.WithBackend("neon"),
		llm.WithSource(loader.NewSource(loader.Isolated())), llm.WithRunnerOptions(llm.WithContextLength(256)))
	if err != nil {
		required.Skip(t, "neon", "isolated neon plugin not available (run make all): %v", err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	srv, err := New(ctx, eng, append([]Option{WithModelName("stories"), WithRestartBackoff(10 * time.Millisecond)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	bs := eng.Backends()
	require.Len(t, bs, 1)
	return hs, srv, bs[0]
}

// killChild kills the plugin host with SIGKILL and waits until the loader sees it gone.
func killChild(t *testing.T, be core.Backend) {
	t.Helper()
	st, ok := loader.Stats(be)
	require.True(t, ok, "not an isolated backend")
	require.NotZero(t, st.PID)
	require.NoError(t, syscall.Kill(st.PID, syscall.SIGKILL))
	require.Eventually(t, func() bool { return loader.Alive(be) != nil }, 5*time.Second, time.Millisecond,
		"the loader never saw the plugin host die")
}

// health returns /health's status code and body.
func health(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url + "/health")
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return resp.StatusCode, body
}

// TestIsolatedCrashMidStream: a plugin host killed during a stream ends that stream with an
// error event, /health says unhealthy until the runner is rebuilt and then reports the
// restart, and the next request succeeds within 5 s.
func TestIsolatedCrashMidStream(t *testing.T) {
	hs, srv, be := isolatedServer(t)
	code, h := health(t, hs.URL)
	require.Equal(t, http.StatusOK, code)
	assert.EqualValues(t, 0, h["restarts"])

	var during map[string]any
	var duringCode int
	srv.hooks.beforeSend = func(n int) {
		if n != 2 {
			return
		}
		killChild(t, be)
		duringCode, during = health(t, hs.URL)
	}
	resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(chatBody("Once upon a time", 100, true)))
	require.NoError(t, err)
	events, done := readSSE(t, resp.Body)
	resp.Body.Close()
	srv.hooks.beforeSend = nil
	assert.False(t, done, "a stream cut by a crash must not end with [DONE]")
	require.NotEmpty(t, events)
	last := events[len(events)-1]
	require.Contains(t, last, "error", "the stream's last event: %v", last)
	assert.Equal(t, "backend_crashed", last["error"].(map[string]any)["code"])
	assert.Equal(t, http.StatusServiceUnavailable, duringCode, "health while the backend is dead: %v", during)
	assert.Equal(t, "unhealthy", during["status"])

	t0 := time.Now()
	code, body := post(t, hs.URL+"/v1/chat/completions", chatBody("Once upon a time", 8, false))
	require.Equal(t, http.StatusOK, code, "%s", body)
	assert.Less(t, time.Since(t0), 5*time.Second)
	var cr response
	require.NoError(t, json.Unmarshal(body, &cr))

	code, h = health(t, hs.URL)
	assert.Equal(t, http.StatusOK, code, "%v", h)
	assert.Equal(t, "ok", h["status"])
	assert.EqualValues(t, 1, h["restarts"])
	assert.NotEmpty(t, h["last_restart"])
}

// TestIsolatedCrashRetried: a crash before any token reached the client is invisible to it:
// the runner is rebuilt and the request runs again. A crash while idle is seen before the
// next request runs.
func TestIsolatedCrashRetried(t *testing.T) {
	tests := []struct {
		name   string
		stream bool
		idle   bool // kill between requests instead of inside one
	}{
		{name: "whole answer"},
		{name: "stream before its first token", stream: true},
		{name: "while idle", idle: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hs, srv, be := isolatedServer(t)
			want, wantFin, _ := streamChat(t, hs.URL, chatBody("Once upon a time", 12, true))
			if tt.idle {
				killChild(t, be)
				code, h := health(t, hs.URL)
				assert.Equal(t, http.StatusServiceUnavailable, code, "%v", h)
			} else {
				srv.hooks.beforeGenerate = func(attempt int) {
					if attempt == 0 {
						killChild(t, be)
					}
				}
				// the chat's cache from the first request is gone with the process
			}
			var got, fin string
			if tt.stream {
				got, fin, _ = streamChat(t, hs.URL, chatBody("Once upon a time", 12, true))
			} else {
				code, body := post(t, hs.URL+"/v1/chat/completions", chatBody("Once upon a time", 12, false))
				require.Equal(t, http.StatusOK, code, "%s", body)
				var cr struct {
					Choices []struct {
						Message      chatMessage `json:"message"`
						FinishReason string      `json:"finish_reason"`
					} `json:"choices"`
				}
				require.NoError(t, json.Unmarshal(body, &cr))
				require.Len(t, cr.Choices, 1)
				got, fin = string(cr.Choices[0].Message.Content), cr.Choices[0].FinishReason
			}
			srv.hooks.beforeGenerate = nil
			assert.Equal(t, want, got, "the answer after the rebuild")
			assert.Equal(t, wantFin, fin)
			code, h := health(t, hs.URL)
			assert.Equal(t, http.StatusOK, code, "%v", h)
			assert.EqualValues(t, 1, h["restarts"])
		})
	}
}

// With several runners one crash restarts the backend once, and every runner is rebuilt
// before it runs again.
func TestIsolatedCrashSeveralRunners(t *testing.T) {
	hs, _, be := isolatedServer(t, WithParallel(2))
	killChild(t, be)
	var wg sync.WaitGroup
	codes := make([]int, 4)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json",
				strings.NewReader(chatBody("Once upon a time", 8, false)))
			if err != nil {
				return // codes[i] stays 0: reported below
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	assert.Equal(t, []int{200, 200, 200, 200}, codes)
	code, h := health(t, hs.URL)
	assert.Equal(t, http.StatusOK, code, "%v", h)
	assert.EqualValues(t, 1, h["restarts"], "one crash, one restart")
	st, ok := loader.Stats(be)
	require.True(t, ok)
	assert.Equal(t, 1, st.Restarts)
}
