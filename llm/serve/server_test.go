package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm"
)

// storiesPath is ../shared/models/stories260K.gguf relative to the repository root.
func storiesPath(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", "..", "shared", "models", "stories260K.gguf")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("test model absent (%s): %v", p, err)
	}
	return p
}

// newTestServer loads the test model on the best device (the reference when no plugin is
// built) and serves it over loopback.
func newTestServer(t testing.TB, opts ...Option) (*httptest.Server, *Server) {
	return newServerAt(t, storiesPath(t), opts...)
}

// newServerAt is newTestServer for the model file at path.
func newServerAt(t testing.TB, path string, opts ...Option) (*httptest.Server, *Server) {
	ctx := context.Background()
	eng, err := llm.Load(ctx, path, llm.WithReferenceFallback(),
		llm.WithRunnerOptions(llm.WithContextLength(256)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = eng.Close() })
	srv, err := New(ctx, eng, append([]Option{WithModelName("stories")}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs, srv
}

func post(t testing.TB, url, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// readSSE reads a server-sent event stream to its end: the data payloads before [DONE], and
// whether [DONE] came.
func readSSE(t testing.TB, r io.Reader) (events []map[string]any, done bool) {
	t.Helper()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		require.True(t, strings.HasPrefix(line, "data: "), "SSE line %q", line)
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			done = true
			continue
		}
		require.False(t, done, "data after [DONE]")
		var ev map[string]any
		require.NoError(t, json.Unmarshal([]byte(data), &ev), data)
		events = append(events, ev)
	}
	require.NoError(t, sc.Err())
	return events, done
}

// streamChat runs a streaming chat completion and returns the content, the finish reason and
// the ids of the chunks.
func streamChat(t testing.TB, url, body string) (text, finish string, ids map[string]bool) {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	events, done := readSSE(t, resp.Body)
	require.True(t, done, "stream ended without [DONE]")
	ids = map[string]bool{}
	var sb strings.Builder
	for _, ev := range events {
		require.Nil(t, ev["error"], "error event %v", ev["error"])
		require.Equal(t, "chat.completion.chunk", ev["object"])
		ids[ev["id"].(string)] = true
		choices := ev["choices"].([]any)
		if len(choices) == 0 {
			continue
		}
		c := choices[0].(map[string]any)
		if d, ok := c["delta"].(map[string]any); ok {
			if s, ok := d["content"].(string); ok {
				sb.WriteString(s)
			}
		}
		if f, ok := c["finish_reason"].(string); ok {
			finish = f
		}
	}
	return sb.String(), finish, ids
}

func chatBody(content string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": "stories", "stream": stream, "temperature": 0,
		"max_tokens": maxTokens, "messages": []map[string]string{{"role": "user", "content": content}}})
	return string(b)
}

func TestModelsHealthMetrics(t *testing.T) {
	hs, _ := newTestServer(t)
	resp, err := http.Get(hs.URL + "/v1/models")
	require.NoError(t, err)
	var ml modelList
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ml))
	resp.Body.Close()
	require.Len(t, ml.Data, 1)
	assert.Equal(t, "stories", ml.Data[0].ID)
	assert.Equal(t, "list", ml.Object)

	resp, err = http.Get(hs.URL + "/health")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp.Body.Close()

	code, _ := post(t, hs.URL+"/v1/chat/completions", chatBody("Hi", 4, false))
	require.Equal(t, http.StatusOK, code)
	resp, err = http.Get(hs.URL + "/metrics")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "text/plain; version=0.0.4; charset=utf-8", resp.Header.Get("Content-Type"))
	m := string(b)
	assert.Contains(t, m, `xpu_requests_total{path="/v1/chat/completions",code="200"} 1`)
	assert.Contains(t, m, `xpu_requests_total{path="/v1/models",code="200"} 1`)
	assert.Contains(t, m, "xpu_generated_tokens_total 4\n")
	assert.Contains(t, m, `xpu_request_duration_seconds_count{path="/v1/chat/completions"} 1`)
	assert.Contains(t, m, "# TYPE xpu_requests_queued gauge")
}

// A non-streaming completion is the runner's own greedy text; the streamed chat chunks add
// up to the non-streamed answer.
func TestCompletionsAndChat(t *testing.T) {
	hs, srv := newTestServer(t)
	code, b := post(t, hs.URL+"/v1/completions", `{"model":"stories","prompt":"Once upon a time","max_tokens":12,"temperature":0}`)
	require.Equal(t, http.StatusOK, code, string(b))
	var got struct {
		Object  string
		Choices []struct {
			Text         string
			FinishReason string `json:"finish_reason"`
		}
		Usage usage
	}
	require.NoError(t, json.Unmarshal(b, &got))
	assert.Equal(t, "text_completion", got.Object)
	require.Len(t, got.Choices, 1)
	assert.Equal(t, "length", got.Choices[0].FinishReason)
	assert.Equal(t, 12, got.Usage.CompletionTokens)

	// The same on a runner of its own.
	r, err := srv.eng.NewRunner(context.Background())
	require.NoError(t, err)
	want, err := r.Generate(context.Background(), "Once upon a time", llm.WithMaxTokens(12))
	require.NoError(t, err)
	require.NoError(t, r.Close())
	assert.Equal(t, want.Text, got.Choices[0].Text)
	assert.Equal(t, want.PromptTokens, got.Usage.PromptTokens)

	code, b = post(t, hs.URL+"/v1/chat/completions", chatBody("Tell me a story.", 10, false))
	require.Equal(t, http.StatusOK, code, string(b))
	var whole struct {
		Object  string
		Choices []struct {
			Message      chatMessage
			FinishReason string `json:"finish_reason"`
		}
	}
	require.NoError(t, json.Unmarshal(b, &whole))
	assert.Equal(t, "chat.completion", whole.Object)
	assert.Equal(t, "assistant", whole.Choices[0].Message.Role)
	text, finish, ids := streamChat(t, hs.URL, chatBody("Tell me a story.", 10, true))
	assert.Equal(t, string(whole.Choices[0].Message.Content), text)
	assert.Equal(t, whole.Choices[0].FinishReason, finish)
	assert.Len(t, ids, 1, "every chunk of a stream carries its completion's id")

	// A stop string ends the text before it.
	stop := strings.Fields(want.Text)[1]
	body := fmt.Sprintf(`{"model":"stories","prompt":"Once upon a time","max_tokens":12,"temperature":0,"stop":[%q]}`, stop)
	code, b = post(t, hs.URL+"/v1/completions", body)
	require.Equal(t, http.StatusOK, code, string(b))
	require.NoError(t, json.Unmarshal(b, &got))
	assert.Equal(t, "stop", got.Choices[0].FinishReason)
	assert.Equal(t, want.Text[:strings.Index(want.Text, stop)], got.Choices[0].Text)
}

// stream_options.include_usage adds a last chunk with the usage and no choices; the
// "developer" role is the system role.
func TestStreamUsage(t *testing.T) {
	hs, _ := newTestServer(t)
	body := `{"model":"stories","stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"temperature":0,` +
		`"messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}]}`
	resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	events, done := readSSE(t, resp.Body)
	require.True(t, done)
	last := events[len(events)-1]
	assert.Empty(t, last["choices"])
	u := last["usage"].(map[string]any)
	assert.Equal(t, 5.0, u["completion_tokens"])
	assert.Positive(t, u["prompt_tokens"])
	assert.Equal(t, u["prompt_tokens"].(float64)+5, u["total_tokens"])
}

// A client that goes away mid-stream frees the runner for the next request.
func TestClientGoneFreesRunner(t *testing.T) {
	hs, srv := newTestServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/chat/completions",
		strings.NewReader(chatBody("Tell me a long story.", 200, true)))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, err = bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	cancel()
	resp.Body.Close()
	require.Eventually(t, func() bool { return srv.slots.idle() == 1 }, 30*time.Second, 10*time.Millisecond)
	code, b := post(t, hs.URL+"/v1/chat/completions", chatBody("Hi", 4, false))
	assert.Equal(t, http.StatusOK, code, string(b))
}

// 8 clients × 10 streamed requests with distinct prompts, on a pool of 2 runners behind a
// queue: every stream completes and carries exactly its own prompt's greedy text.
func TestConcurrentStreams(t *testing.T) {
	hs, _ := newTestServer(t, WithParallel(2))
	const clients, each = 8, 10
	prompts := []string{"Lily", "Tom", "a dog", "the sun", "a boat", "a cake", "the park", "a bird"}
	want := map[string]string{}
	for _, p := range prompts {
		want[p], _, _ = streamChat(t, hs.URL, chatBody("Tell me about "+p+".", 8, true))
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[string]bool{}
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				p := prompts[(c+i)%len(prompts)]
				text, finish, ids := streamChat(t, hs.URL, chatBody("Tell me about "+p+".", 8, true))
				assert.Equal(t, want[p], text, "client %d request %d (%s)", c, i, p)
				assert.NotEmpty(t, finish)
				mu.Lock()
				for id := range ids {
					assert.False(t, seen[id], "completion id %s seen twice", id)
					seen[id] = true
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.Len(t, seen, clients*each)
}

func TestBadRequests(t *testing.T) {
	hs, _ := newTestServer(t, WithMaxTokens(64), WithMaxBodyBytes(4096))
	long := strings.Repeat("once upon a time ", 100)
	tests := []struct {
		name, path, body string
		status           int
		param            string
	}{
		{"invalid JSON", "/v1/chat/completions", `{"model": "stories", "messages": [`, 400, ""},
		{"empty body", "/v1/completions", ``, 400, ""},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-4","messages":[{"role":"user","content":"hi"}]}`, 404, "model"},
		{"too many tokens", "/v1/chat/completions", `{"model":"stories","max_tokens":100000,"messages":[{"role":"user","content":"hi"}]}`, 400, "max_tokens"},
		{"zero tokens", "/v1/completions", `{"model":"stories","max_tokens":0,"prompt":"hi"}`, 400, "max_tokens"},
		{"past the context", "/v1/completions", `{"model":"stories","max_tokens":60,"prompt":"` + long[:700] + `"}`, 400, "max_tokens"},
		{"prompt longer than the context", "/v1/completions", `{"model":"stories","prompt":"` + long[:1600] + `"}`, 400, "prompt"},
		{"body too large", "/v1/completions", `{"model":"stories","prompt":"` + strings.Repeat("a", 5000) + `"}`, 413, ""},
		{"no messages", "/v1/chat/completions", `{"model":"stories","messages":[]}`, 400, "messages"},
		{"bad role", "/v1/chat/completions", `{"model":"stories","messages":[{"role":"wizard","content":"hi"}]}`, 400, "messages[0].role"},
		{"image part", "/v1/chat/completions", `{"model":"stories","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, ""},
		{"n too large", "/v1/completions", `{"model":"stories","prompt":"hi","n":17}`, 400, "n"},
		{"temperature", "/v1/completions", `{"model":"stories","prompt":"hi","temperature":-1}`, 400, "temperature"},
		{"top_p", "/v1/completions", `{"model":"stories","prompt":"hi","top_p":0}`, 400, "top_p"},
		{"malformed tool", "/v1/chat/completions", `{"model":"stories","tools":[{"type":"function"}],"messages":[{"role":"user","content":"hi"}]}`, 400, "tools[0]"},
		{"unknown response_format", "/v1/chat/completions", `{"model":"stories","response_format":{"type":"yaml"},"messages":[{"role":"user","content":"hi"}]}`, 400, "response_format"},
		{"prompt list", "/v1/completions", `{"model":"stories","prompt":["a","b"]}`, 400, "prompt"},
		{"unknown path", "/v1/nothing", `{}`, 404, ""},
		{"trailing garbage", "/v1/completions", `{"model":"stories","prompt":"hi","max_tokens":2} garbage`, 400, ""},
		{"two JSON values", "/v1/chat/completions", `{"model":"stories","messages":[{"role":"user","content":"hi"}]}{"model":"x"}`, 400, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, b := post(t, hs.URL+tc.path, tc.body)
			assert.Equal(t, tc.status, code, string(b))
			var e struct {
				Error struct {
					Message string
					Type    string
					Param   *string
					Code    *string
				}
			}
			require.NoError(t, json.Unmarshal(b, &e), string(b))
			assert.NotEmpty(t, e.Error.Message)
			assert.NotEmpty(t, e.Error.Type)
			if tc.param != "" {
				require.NotNil(t, e.Error.Param)
				assert.Equal(t, tc.param, *e.Error.Param)
			}
		})
	}
	resp, err := http.Get(hs.URL + "/v1/chat/completions")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

// A full queue refuses with 429; a request that waits past the timeout gets 503.
func TestQueueLimits(t *testing.T) {
	hs, srv := newTestServer(t, WithMaxQueue(0), WithRequestTimeout(2*time.Second))
	sl := srv.slots.take(nil) // hold the only runner
	code, b := post(t, hs.URL+"/v1/completions", `{"model":"stories","prompt":"hi","max_tokens":2}`)
	assert.Equal(t, http.StatusTooManyRequests, code, string(b))
	srv.slots.put(sl)

	hs2, srv2 := newTestServer(t, WithMaxQueue(1), WithRequestTimeout(200*time.Millisecond))
	sl = srv2.slots.take(nil)
	code, b = post(t, hs2.URL+"/v1/completions", `{"model":"stories","prompt":"hi","max_tokens":2}`)
	assert.Equal(t, http.StatusServiceUnavailable, code, string(b))
	srv2.slots.put(sl)
	code, b = post(t, hs2.URL+"/v1/completions", `{"model":"stories","prompt":"hi","max_tokens":2}`)
	assert.Equal(t, http.StatusOK, code, string(b))
}

// Shutdown lets a stream in flight run to its [DONE].
func TestShutdownFinishesStreams(t *testing.T) {
	_, srv := newTestServer(t)
	hs := httptest.NewUnstartedServer(srv.Handler())
	hs.Start()
	resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(chatBody("Tell me a long story.", 200, true)))
	require.NoError(t, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n') // the stream has begun
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(first, "data: "))
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		shut <- hs.Config.Shutdown(ctx)
	}()
	events, done := readSSE(t, io.MultiReader(strings.NewReader(first), br))
	assert.True(t, done, "the stream ran to [DONE] during shutdown")
	assert.NotEmpty(t, events)
	require.NoError(t, <-shut)
	_, err = http.Post(hs.URL+"/v1/completions", "application/json", bytes.NewReader([]byte(`{}`)))
	assert.Error(t, err, "the listener is closed after shutdown")
}

func TestNewRejectsBadOptions(t *testing.T) {
	ctx := context.Background()
	eng, err := llm.Load(ctx, storiesPath(t), llm.WithBackend("ref"))
	require.NoError(t, err)
	defer eng.Close()
	for _, o := range []Option{WithParallel(0), WithMaxTokens(0), WithMaxBodyBytes(0),
		WithRequestTimeout(0), WithMaxQueue(-1), WithModelName("")} {
		_, err := New(ctx, eng, o)
		assert.Error(t, err)
	}
}

// White space after the JSON body is fine (only other data is refused).
func TestTrailingWhiteSpace(t *testing.T) {
	hs, _ := newTestServer(t)
	code, b := post(t, hs.URL+"/v1/completions", "{\"model\":\"stories\",\"prompt\":\"hi\",\"max_tokens\":2}\r\n \t\n")
	assert.Equal(t, http.StatusOK, code, string(b))
}

// A whole (unstreamed) answer cut by the request timeout keeps the text made so far and ends
// with finish_reason "length", as a stream does, instead of a 504 that drops it.
func TestTimeoutKeepsText(t *testing.T) {
	// long enough that a loaded CI machine makes three pieces within it (-race, both cores busy)
	const timeout = 2 * time.Second
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		t.Run(path, func(t *testing.T) {
			hs, srv := newTestServer(t, WithRequestTimeout(timeout))
			srv.hooks.beforeSend = func(n int) {
				if n == 3 { // past the deadline with three pieces made
					time.Sleep(timeout + 100*time.Millisecond)
				}
			}
			body := `{"model":"stories","prompt":"Once upon a time","max_tokens":100,"temperature":0}`
			if path == "/v1/chat/completions" {
				body = chatBody("Once upon a time", 100, false)
			}
			code, b := post(t, hs.URL+path, body)
			require.Equal(t, http.StatusOK, code, string(b))
			var resp struct {
				Choices []struct {
					Text         string      `json:"text"`
					Message      chatMessage `json:"message"`
					FinishReason string      `json:"finish_reason"`
				} `json:"choices"`
				Usage usage `json:"usage"`
			}
			require.NoError(t, json.Unmarshal(b, &resp), string(b))
			require.Len(t, resp.Choices, 1)
			c := resp.Choices[0]
			assert.Equal(t, "length", c.FinishReason)
			assert.NotEmpty(t, c.Text+string(c.Message.Content), "the text made before the timeout")
			assert.GreaterOrEqual(t, resp.Usage.CompletionTokens, 3)
			assert.Less(t, resp.Usage.CompletionTokens, 100)
		})
	}
}

// A raw prompt's control-token texts become the control tokens (llama.cpp's behaviour) unless
// the server was started WithoutSpecialTokens; chat messages never have theirs parsed.
func TestRawPromptSpecialTokens(t *testing.T) {
	promptTokens := func(t *testing.T, url, path, body string) int {
		code, b := post(t, url+path, body)
		require.Equal(t, http.StatusOK, code, string(b))
		var r struct{ Usage usage }
		require.NoError(t, json.Unmarshal(b, &r))
		return r.Usage.PromptTokens
	}
	const raw = `{"model":"stories","prompt":"Once</s>","max_tokens":1}`
	parsed, _ := newTestServer(t)
	plain, _ := newTestServer(t, WithoutSpecialTokens())
	withEOS := promptTokens(t, parsed.URL, "/v1/completions", raw)
	spelled := promptTokens(t, plain.URL, "/v1/completions", raw)
	assert.Greater(t, spelled, withEOS+1, "</s> spelled as text takes several tokens, parsed one")
	chat := chatBody("Once</s>", 1, false)
	assert.Equal(t, promptTokens(t, parsed.URL, "/v1/chat/completions", chat),
		promptTokens(t, plain.URL, "/v1/chat/completions", chat), "chat messages are plain either way")
}

// Rendering the chat template is part of the request's time: a template that is slow on this
// conversation is stopped at the request timeout with 504, and the server keeps serving.
func TestSlowTemplateStopsAtTimeout(t *testing.T) {
	quadratic := "{% for m in messages %}{% for a in m.content %}{% for b in m.content %}{% endfor %}{% endfor %}" +
		"{{ m.content }}{% endfor %}"
	hs, _ := newTestServer(t, WithRequestTimeout(200*time.Millisecond),
		WithChatOptions(llm.WithChatTemplate(quadratic)), WithMaxBodyBytes(1<<20))
	t0 := time.Now()
	code, b := post(t, hs.URL+"/v1/chat/completions", chatBody(strings.Repeat("x", 20000), 4, false))
	assert.Equal(t, http.StatusGatewayTimeout, code, string(b))
	assert.Contains(t, string(b), "chat template")
	assert.Less(t, time.Since(t0), 2*time.Second)
	code, b = post(t, hs.URL+"/v1/chat/completions", chatBody("hi", 2, false))
	assert.Equal(t, http.StatusOK, code, string(b))
}
