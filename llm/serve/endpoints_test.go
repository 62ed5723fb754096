package serve

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, v), string(b))
	return resp.StatusCode
}

func TestModelByID(t *testing.T) {
	hs, _ := newTestServer(t)
	var m map[string]any
	assert.Equal(t, 200, getJSON(t, hs.URL+"/v1/models/stories", &m))
	assert.Equal(t, "stories", m["id"])
	assert.Equal(t, "model", m["object"])
	var e struct{ Error struct{ Code string } }
	assert.Equal(t, 404, getJSON(t, hs.URL+"/v1/models/gpt-4", &e))
	assert.Equal(t, "model_not_found", e.Error.Code)
}

// llama-server's endpoints answer in its shapes.
func TestLlamaServerEndpoints(t *testing.T) {
	hs, srv := newTestServer(t, WithMaxTokens(64), WithParallel(2))

	code, b := post(t, hs.URL+"/tokenize", `{"content":"Once upon a time","add_special":true}`)
	require.Equal(t, 200, code, string(b))
	var tk struct{ Tokens []int32 }
	require.NoError(t, json.Unmarshal(b, &tk))
	assert.Equal(t, srv.tok.Encode("Once upon a time", true), tk.Tokens)
	assert.Equal(t, srv.tok.BOS(), tk.Tokens[0])

	code, b = post(t, hs.URL+"/tokenize", `{"content":"Once","with_pieces":true}`)
	require.Equal(t, 200, code, string(b))
	var pieces struct {
		Tokens []struct {
			ID    int32
			Piece string
		}
	}
	require.NoError(t, json.Unmarshal(b, &pieces))
	require.NotEmpty(t, pieces.Tokens)
	assert.NotEqual(t, srv.tok.BOS(), pieces.Tokens[0].ID, "add_special defaults to false")

	body, _ := json.Marshal(map[string]any{"tokens": tk.Tokens[1:]})
	code, b = post(t, hs.URL+"/detokenize", string(body))
	require.Equal(t, 200, code, string(b))
	var dt struct{ Content string }
	require.NoError(t, json.Unmarshal(b, &dt))
	assert.Equal(t, "Once upon a time", strings.TrimSpace(dt.Content))

	code, b = post(t, hs.URL+"/detokenize", `{"tokens":[999999]}`)
	assert.Equal(t, 400, code, string(b))

	// /completion: text and token prompts give the same greedy answer
	var c1, c2 map[string]any
	code, b = post(t, hs.URL+"/completion", `{"prompt":"Once upon a time","n_predict":8,"temperature":0,"n_probs":2}`)
	require.Equal(t, 200, code, string(b))
	require.NoError(t, json.Unmarshal(b, &c1))
	assert.Equal(t, true, c1["stop"])
	assert.Equal(t, "limit", c1["stop_type"])
	assert.EqualValues(t, 8, c1["tokens_predicted"])
	assert.NotEmpty(t, c1["content"])
	assert.Len(t, c1["completion_probabilities"], 8)
	body, _ = json.Marshal(map[string]any{"prompt": tk.Tokens, "n_predict": 8, "temperature": 0})
	code, b = post(t, hs.URL+"/completion", string(body))
	require.Equal(t, 200, code, string(b))
	require.NoError(t, json.Unmarshal(b, &c2))
	assert.Equal(t, c1["content"], c2["content"])

	// streamed: data lines without [DONE], the last with stop true
	resp, err := http.Post(hs.URL+"/completion", "application/json",
		strings.NewReader(`{"prompt":"Once upon a time","n_predict":8,"temperature":0,"stream":true}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	var text string
	var last map[string]any
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() == "" {
			continue
		}
		require.True(t, strings.HasPrefix(sc.Text(), "data: "), sc.Text())
		require.NotEqual(t, "data: [DONE]", sc.Text())
		last = nil
		require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(sc.Text(), "data: ")), &last))
		text += last["content"].(string)
	}
	require.NotNil(t, last)
	assert.Equal(t, true, last["stop"])
	assert.Equal(t, c1["content"], text)

	for _, bad := range []struct{ body, param string }{
		{`{"n_predict":4}`, "prompt"},
		{`{"prompt":[99999999]}`, "prompt"},
		{`{"prompt":"x","n_probs":50}`, "n_probs"},
		{`{"prompt":"x","min_p":2}`, "min_p"},
	} {
		code, b := post(t, hs.URL+"/completion", bad.body)
		assert.Equal(t, 400, code, bad.body)
		assert.Contains(t, string(b), `"param":"`+bad.param+`"`, bad.body)
	}

	var props map[string]any
	require.Equal(t, 200, getJSON(t, hs.URL+"/props", &props))
	assert.EqualValues(t, 2, props["total_slots"])
	assert.EqualValues(t, 256, props["default_generation_settings"].(map[string]any)["n_ctx"])

	var slots []map[string]any
	require.Equal(t, 200, getJSON(t, hs.URL+"/slots", &slots))
	require.Len(t, slots, 2)
	assert.Equal(t, false, slots[0]["is_processing"])
	held := srv.slots.take(nil) // a request holding a runner
	require.NotNil(t, held)
	require.Equal(t, 200, getJSON(t, hs.URL+"/slots", &slots))
	srv.slots.put(held)
	assert.Equal(t, true, slots[0]["is_processing"])
	assert.Equal(t, false, slots[1]["is_processing"])
}

// ollama's API: NDJSON streams whose parts add up to the whole answer, the final line with
// done and the counts, and ollama's error shape.
func TestOllamaEndpoints(t *testing.T) {
	hs, _ := newTestServer(t, WithMaxTokens(64))
	ndjson := func(path, body string) []map[string]any {
		resp, err := http.Post(hs.URL+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, "application/x-ndjson", resp.Header.Get("Content-Type"))
		var out []map[string]any
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var m map[string]any
			require.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text())
			out = append(out, m)
		}
		return out
	}
	for _, tc := range []struct {
		name, path, body string
		text             func(map[string]any) string
	}{
		{"generate", "/api/generate", `{"model":"stories","prompt":"Once upon a time","options":{"temperature":0,"num_predict":10}`,
			func(m map[string]any) string { return m["response"].(string) }},
		{"generate raw", "/api/generate", `{"model":"stories:latest","raw":true,"prompt":"Once upon a time","options":{"temperature":0,"num_predict":10}`,
			func(m map[string]any) string { return m["response"].(string) }},
		{"chat", "/api/chat", `{"model":"stories","messages":[{"role":"user","content":"hi"}],"options":{"temperature":0,"num_predict":10}`,
			func(m map[string]any) string { return m["message"].(map[string]any)["content"].(string) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parts := ndjson(tc.path, tc.body+`}`)
			require.Greater(t, len(parts), 2)
			var text string
			for i, p := range parts {
				assert.Equal(t, i == len(parts)-1, p["done"], "part %d", i)
				text += tc.text(p)
			}
			last := parts[len(parts)-1]
			assert.EqualValues(t, 10, last["eval_count"])
			assert.Positive(t, last["prompt_eval_count"])
			assert.Equal(t, "length", last["done_reason"])
			code, b := post(t, hs.URL+tc.path, tc.body+`,"stream":false}`)
			require.Equal(t, 200, code, string(b))
			var whole map[string]any
			require.NoError(t, json.Unmarshal(b, &whole))
			assert.Equal(t, true, whole["done"])
			assert.Equal(t, text, tc.text(whole), "the stream adds up to the whole answer")
		})
	}
	var tags struct{ Models []struct{ Name string } }
	require.Equal(t, 200, getJSON(t, hs.URL+"/api/tags", &tags))
	require.Len(t, tags.Models, 1)
	assert.Equal(t, "stories:latest", tags.Models[0].Name)
	var v struct{ Version string }
	require.Equal(t, 200, getJSON(t, hs.URL+"/api/version", &v))
	assert.NotEmpty(t, v.Version)
	code, b := post(t, hs.URL+"/api/show", `{"model":"stories"}`)
	require.Equal(t, 200, code, string(b))
	assert.Contains(t, string(b), `"family":"llama"`)

	for _, bad := range []struct {
		path, body string
		status     int
		msg        string
	}{
		{"/api/generate", `{"model":"nope","prompt":"x"}`, 404, "not found"},
		{"/api/show", `{"model":"nope"}`, 404, "not found"},
		{"/api/chat", `{"model":"stories","messages":[]}`, 400, "messages"},
		{"/api/chat", `{"model":"stories","messages":[{"role":"user","content":"x"}],"tools":[{}]}`, 400, "tools"},
		{"/api/generate", `{"model":"stories","prompt":"x","format":"json"}`, 400, "format"},
		{"/api/generate", `{"model":"stories","prompt":"x","options":{"top_p":5}}`, 400, "top_p"},
	} {
		code, b := post(t, hs.URL+bad.path, bad.body)
		assert.Equal(t, bad.status, code, bad.body)
		var e struct{ Error string }
		require.NoError(t, json.Unmarshal(b, &e), string(b))
		assert.Contains(t, e.Error, bad.msg, bad.body)
	}
}
