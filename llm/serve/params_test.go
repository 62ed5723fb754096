package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openAIParams is every parameter of OpenAI's chat and completions APIs, with a value that
// asks for something, and what the server does with it; docs/openai-api.md is the same table.
// A refused row's param must be named in the 400; an honoured row must answer 200.
var openAIParams = []struct {
	api   string // "chat" or "completions"
	param string
	value string
	want  int // 200 honoured (or accepted), 400 refused
}{
	{"chat", "messages", `[{"role":"user","content":"hi"}]`, 200},
	{"chat", "model", `"stories"`, 200},
	{"chat", "audio", `{"voice":"alloy","format":"wav"}`, 400},
	{"chat", "frequency_penalty", `0.5`, 200},
	{"chat", "function_call", `{"name":"f"}`, 400},
	{"chat", "functions", `[{"name":"f","parameters":{}}]`, 400},
	{"chat", "logit_bias", `{"5":-100}`, 200},
	{"chat", "logprobs", `true`, 200},
	{"chat", "max_completion_tokens", `3`, 200},
	{"chat", "max_tokens", `3`, 200},
	{"chat", "metadata", `{"k":"v"}`, 200},
	{"chat", "modalities", `["text","audio"]`, 400},
	{"chat", "n", `2`, 200},
	{"chat", "parallel_tool_calls", `true`, 200},
	{"chat", "prediction", `{"type":"content","content":"x"}`, 400},
	{"chat", "presence_penalty", `-0.5`, 200},
	{"chat", "prompt_cache_key", `"k"`, 200},
	{"chat", "reasoning_effort", `"low"`, 400},
	{"chat", "response_format", `{"type":"json_object"}`, 200},
	{"chat", "safety_identifier", `"u1"`, 200},
	{"chat", "seed", `7`, 200},
	{"chat", "service_tier", `"auto"`, 200},
	{"chat", "stop", `["\n"]`, 200},
	{"chat", "store", `true`, 400},
	{"chat", "stream", `false`, 200},
	{"chat", "stream_options", `{"include_usage":true}`, 200},
	{"chat", "temperature", `0.5`, 200},
	{"chat", "tool_choice", `"required"`, 200}, // with tools (below)
	{"chat", "tools", `[{"type":"function","function":{"name":"f"}}]`, 200},
	{"chat", "top_logprobs", `2`, 200}, // with logprobs: true (below)
	{"chat", "top_p", `0.9`, 200},
	{"chat", "user", `"u1"`, 200},
	{"chat", "verbosity", `"low"`, 400},
	{"chat", "web_search_options", `{}`, 400},
	// llama-server's extensions
	{"chat", "top_k", `40`, 200},
	{"chat", "min_p", `0.05`, 200},
	{"chat", "typical_p", `0.9`, 200},
	{"chat", "repeat_penalty", `1.1`, 200},
	{"chat", "repeat_last_n", `-1`, 200},
	{"chat", "timings_per_token", `true`, 200},
	// the completions API
	{"completions", "model", `"stories"`, 200},
	{"completions", "prompt", `"once"`, 200},
	{"completions", "best_of", `3`, 400},
	{"completions", "echo", `true`, 200},
	{"completions", "frequency_penalty", `1`, 200},
	{"completions", "logit_bias", `{"5":10}`, 200},
	{"completions", "logprobs", `3`, 200},
	{"completions", "max_tokens", `3`, 200},
	{"completions", "n", `2`, 200},
	{"completions", "presence_penalty", `1`, 200},
	{"completions", "seed", `1`, 200},
	{"completions", "stop", `"x"`, 200},
	{"completions", "stream", `false`, 200},
	{"completions", "stream_options", `{"include_usage":true}`, 200},
	{"completions", "suffix", `" the end"`, 400},
	{"completions", "temperature", `0`, 200},
	{"completions", "top_p", `0.5`, 200},
	{"completions", "user", `"u1"`, 200},
	{"completions", "top_k", `5`, 200},
	{"completions", "min_p", `0.1`, 200},
	{"completions", "typical_p", `0.5`, 200},
	{"completions", "repeat_penalty", `1.3`, 200},
	{"completions", "repeat_last_n", `0`, 200},
	{"completions", "timings_per_token", `true`, 200},
}

// requestWith is a small request of api with param set to value.
func requestWith(api, param, value string) (path, body string) {
	fields := map[string]string{"model": `"stories"`, "max_tokens": `3`}
	if api == "chat" {
		path, fields["messages"] = "/v1/chat/completions", `[{"role":"user","content":"hi"}]`
	} else {
		path, fields["prompt"] = "/v1/completions", `"once upon"`
	}
	fields[param] = value
	if param == "top_logprobs" {
		fields["logprobs"] = "true"
	}
	if param == "tool_choice" && value != `"none"` {
		fields["tools"] = `[{"type":"function","function":{"name":"f"}}]`
	}
	var parts []string
	for k, v := range fields {
		parts = append(parts, fmt.Sprintf("%q:%s", k, v))
	}
	return path, "{" + strings.Join(parts, ",") + "}"
}

func TestEveryOpenAIParameter(t *testing.T) {
	hs, _ := newTestServer(t, WithMaxTokens(64))
	for _, p := range openAIParams {
		t.Run(p.api+"/"+p.param, func(t *testing.T) {
			path, body := requestWith(p.api, p.param, p.value)
			code, b := post(t, hs.URL+path, body)
			require.Equal(t, p.want, code, "%s\n%s", body, b)
			if p.want != 200 {
				var e struct{ Error struct{ Param *string } }
				require.NoError(t, json.Unmarshal(b, &e), string(b))
				require.NotNil(t, e.Error.Param, string(b))
				assert.Equal(t, p.param, *e.Error.Param)
			}
		})
	}
}

// A refused parameter at its neutral value (what clients send by default) is accepted, and
// so is a field nobody defined.
func TestNeutralValuesAccepted(t *testing.T) {
	hs, _ := newTestServer(t, WithMaxTokens(64))
	for _, tc := range []struct{ api, param, value string }{
		{"chat", "tools", `[]`}, {"chat", "tool_choice", `"none"`}, {"chat", "store", `false`},
		{"chat", "audio", `null`}, {"chat", "modalities", `["text"]`}, {"chat", "response_format", `{"type": "text"}`},
		{"chat", "function_call", `"auto"`}, {"chat", "x_unknown_field", `{"a":1}`},
		{"completions", "suffix", `""`}, {"completions", "best_of", `1`}, {"completions", "logprobs", `null`},
	} {
		t.Run(tc.api+"/"+tc.param, func(t *testing.T) {
			path, body := requestWith(tc.api, tc.param, tc.value)
			code, b := post(t, hs.URL+path, body)
			assert.Equal(t, 200, code, "%s\n%s", body, b)
		})
	}
}

// Out-of-range values of the honoured knobs are refused naming the parameter.
func TestKnobRanges(t *testing.T) {
	hs, _ := newTestServer(t, WithMaxTokens(64))
	for _, tc := range []struct{ api, param, value, msg string }{
		{"chat", "frequency_penalty", `2.5`, "between -2 and 2"},
		{"chat", "presence_penalty", `-3`, "between -2 and 2"},
		{"chat", "logit_bias", `{"5":101}`, "between -100 and 100"},
		{"chat", "logit_bias", `{"abc":1}`, "token id"},
		{"chat", "logit_bias", `{"99999":1}`, "token id"},
		{"chat", "top_logprobs", `21`, "0 to 20"},
		{"chat", "n", `0`, "1 to 16"},
		{"chat", "top_k", `-1`, "0 (off) or more"},
		{"chat", "min_p", `1.5`, "between 0 and 1"},
		{"chat", "typical_p", `-0.1`, "between 0 and 1"},
		{"chat", "repeat_penalty", `-1`, "between 0 and 100"},
		{"chat", "repeat_last_n", `-2`, "-1 (the context)"},
		{"completions", "logprobs", `6`, "0 to 5"},
		{"completions", "best_of", `2`, "best_of = n"},
	} {
		t.Run(tc.param+"="+tc.value, func(t *testing.T) {
			path, body := requestWith(tc.api, tc.param, tc.value)
			code, b := post(t, hs.URL+path, body)
			require.Equal(t, 400, code, "%s\n%s", body, b)
			var e struct {
				Error struct{ Message, Param string }
			}
			require.NoError(t, json.Unmarshal(b, &e))
			assert.Equal(t, tc.param, e.Error.Param)
			assert.Contains(t, e.Error.Message, tc.msg)
		})
	}
	// top_logprobs without logprobs is OpenAI's error too
	code, b := post(t, hs.URL+"/v1/chat/completions", `{"model":"stories","top_logprobs":2,"messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, 400, code, string(b))
	assert.Contains(t, string(b), "needs logprobs")
}

type choiceOut struct {
	Index    int
	Text     string
	Message  struct{ Content string }
	Logprobs *struct {
		Content []struct {
			Token       string
			Logprob     float64
			Bytes       []int
			TopLogprobs []struct {
				Token   string
				Logprob float64
			} `json:"top_logprobs"`
		}
		Tokens        []string
		TokenLogprobs []float64            `json:"token_logprobs"`
		TopLogprobs   []map[string]float64 `json:"top_logprobs"`
		TextOffset    []int                `json:"text_offset"`
	}
}

func postChoices(t *testing.T, url, body string) ([]choiceOut, map[string]int) {
	t.Helper()
	code, b := post(t, url, body)
	require.Equal(t, 200, code, string(b))
	var out struct {
		Choices []choiceOut
		Usage   struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			TotalTokens      int `json:"total_tokens"`
		}
	}
	require.NoError(t, json.Unmarshal(b, &out), string(b))
	return out.Choices, map[string]int{"prompt_tokens": out.Usage.PromptTokens,
		"completion_tokens": out.Usage.CompletionTokens, "total_tokens": out.Usage.TotalTokens}
}

// The honoured knobs change the answer as they should.
func TestKnobsHonoured(t *testing.T) {
	hs, srv := newTestServer(t, WithMaxTokens(64))
	chat := hs.URL + "/v1/chat/completions"
	comp := hs.URL + "/v1/completions"
	msgs := `"messages":[{"role":"user","content":"Once upon a time"}]`

	t.Run("logprobs", func(t *testing.T) {
		cs, _ := postChoices(t, chat, `{"model":"stories","temperature":0,"max_tokens":5,"logprobs":true,"top_logprobs":3,`+msgs+`}`)
		require.Len(t, cs, 1)
		require.NotNil(t, cs[0].Logprobs)
		lp := cs[0].Logprobs.Content
		require.Len(t, lp, 5)
		var text strings.Builder
		for _, e := range lp {
			text.WriteString(e.Token)
			assert.LessOrEqual(t, e.Logprob, 0.0)
			require.Len(t, e.TopLogprobs, 3)
			// greedy: the token drawn is the most likely
			assert.Equal(t, e.Token, e.TopLogprobs[0].Token)
			assert.InDelta(t, e.Logprob, e.TopLogprobs[0].Logprob, 1e-9)
			assert.GreaterOrEqual(t, e.TopLogprobs[0].Logprob, e.TopLogprobs[1].Logprob)
			assert.Equal(t, len(e.Token), len(e.Bytes))
		}
		assert.Equal(t, cs[0].Message.Content, text.String(), "the tokens spell the answer")
		// without logprobs, none
		cs, _ = postChoices(t, chat, `{"model":"stories","max_tokens":2,`+msgs+`}`)
		assert.Nil(t, cs[0].Logprobs)
	})
	t.Run("completions logprobs and echo", func(t *testing.T) {
		cs, _ := postChoices(t, comp, `{"model":"stories","temperature":0,"max_tokens":4,"logprobs":2,"echo":true,"prompt":"Once upon"}`)
		require.NotNil(t, cs[0].Logprobs)
		l := cs[0].Logprobs
		require.Len(t, l.Tokens, 4)
		require.Len(t, l.TopLogprobs, 4)
		assert.True(t, strings.HasPrefix(cs[0].Text, "Once upon"), cs[0].Text)
		for i, tok := range l.Tokens {
			assert.Equal(t, tok, cs[0].Text[l.TextOffset[i]:l.TextOffset[i]+len(tok)], "text_offset %d", i)
			assert.LessOrEqual(t, len(l.TopLogprobs[i]), 2)
		}
	})
	t.Run("n choices", func(t *testing.T) {
		cs, u := postChoices(t, chat, `{"model":"stories","n":3,"seed":5,"temperature":1.5,"max_tokens":12,`+msgs+`}`)
		require.Len(t, cs, 3)
		texts := map[string]bool{}
		for i, c := range cs {
			assert.Equal(t, i, c.Index)
			texts[c.Message.Content] = true
		}
		assert.Greater(t, len(texts), 1, "each choice draws with its own seed")
		assert.Equal(t, u["prompt_tokens"]+u["completion_tokens"], u["total_tokens"])
		assert.Greater(t, u["completion_tokens"], 12, "usage counts every choice")
		// the same seed gives the same choices
		again, _ := postChoices(t, chat, `{"model":"stories","n":3,"seed":5,"temperature":1.5,"max_tokens":12,`+msgs+`}`)
		assert.Equal(t, cs, again)
	})
	greedy := func(extra string) string {
		cs, _ := postChoices(t, comp, `{"model":"stories","temperature":0,"max_tokens":40,"prompt":"Once upon a time"`+extra+`}`)
		return cs[0].Text
	}
	plain := greedy("")
	t.Run("logit_bias forces a token", func(t *testing.T) {
		cs, _ := postChoices(t, comp, `{"model":"stories","temperature":0,"max_tokens":6,"logprobs":0,"logit_bias":{"300":100},"prompt":"Once"}`)
		assert.NotEqual(t, plain, cs[0].Text)
		for _, tok := range cs[0].Logprobs.Tokens {
			assert.Equal(t, srv.tok.Piece(300), tok)
		}
	})
	for _, extra := range []string{`,"frequency_penalty":2`, `,"frequency_penalty":-2`, `,"presence_penalty":2`,
		`,"presence_penalty":-2`, `,"repeat_penalty":3`} {
		t.Run("penalty "+extra[2:], func(t *testing.T) {
			assert.NotEqual(t, plain, greedy(extra), "greedy text repeats itself; a penalty changes it")
		})
	}
	t.Run("repeat_last_n 0 turns penalties off", func(t *testing.T) {
		assert.Equal(t, plain, greedy(`,"frequency_penalty":2,"repeat_last_n":0`))
	})
	t.Run("top_k 1 is greedy", func(t *testing.T) {
		assert.Equal(t, plain, greedy(`,"temperature":1.5,"top_k":1,"seed":3`))
	})
	t.Run("min_p 1 is greedy", func(t *testing.T) {
		assert.Equal(t, plain, greedy(`,"temperature":1.5,"min_p":1,"seed":3`))
	})
}

// Streamed chat with n = 2 and logprobs: every chunk names its choice, each choice ends with
// a finish_reason, the logprobs' tokens spell each choice's text.
func TestStreamChoicesLogprobs(t *testing.T) {
	hs, _ := newTestServer(t, WithMaxTokens(64))
	resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"stories","stream":true,"n":2,"seed":1,"temperature":1,"max_tokens":8,"logprobs":true,"messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	events, done := readSSE(t, resp.Body)
	require.True(t, done)
	text, lpText := map[int]string{}, map[int]string{}
	finished := map[int]bool{}
	for _, ev := range events {
		for _, c := range ev["choices"].([]any) {
			c := c.(map[string]any)
			i := int(c["index"].(float64))
			if d, ok := c["delta"].(map[string]any); ok {
				if s, ok := d["content"].(string); ok {
					text[i] += s
				}
			}
			if lp, ok := c["logprobs"].(map[string]any); ok {
				for _, e := range lp["content"].([]any) {
					lpText[i] += e.(map[string]any)["token"].(string)
				}
			}
			if c["finish_reason"] != nil {
				finished[i] = true
			}
		}
	}
	assert.Equal(t, map[int]bool{0: true, 1: true}, finished)
	assert.Equal(t, text, lpText)
	assert.NotEmpty(t, text[0])
}

// With timings_per_token (llama-server's), every streamed chunk of a completion or a chat
// carries timings whose predicted_n counts the tokens so far: it never falls, grows by at least
// one with each chunk of text, and ends at the usage's completion tokens; without it no chunk
// has timings.
func TestStreamTimingsPerToken(t *testing.T) {
	hs, _ := newTestServer(t, WithMaxTokens(64))
	for _, tc := range []struct {
		name, path, body string
		timings          bool
	}{
		{"completions", "/v1/completions", `"prompt":"Once upon a time"`, true},
		{"chat", "/v1/chat/completions", `"messages":[{"role":"user","content":"hi"}]`, true},
		{"not asked", "/v1/completions", `"prompt":"Once upon a time"`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := fmt.Sprintf(`{"model":"stories","stream":true,"stream_options":{"include_usage":true},"temperature":0,"max_tokens":24,"timings_per_token":%v,%s}`,
				tc.timings, tc.body)
			resp, err := http.Post(hs.URL+tc.path, "application/json", strings.NewReader(body))
			require.NoError(t, err)
			defer resp.Body.Close()
			events, done := readSSE(t, resp.Body)
			require.True(t, done)
			last, texts, completion := 0, 0, -1
			for _, ev := range events {
				if u, ok := ev["usage"].(map[string]any); ok {
					completion = int(u["completion_tokens"].(float64))
					continue
				}
				tm, ok := ev["timings"].(map[string]any)
				if !tc.timings {
					require.False(t, ok, "timings without timings_per_token: %v", ev)
					continue
				}
				require.True(t, ok, "a chunk without timings: %v", ev)
				n := int(tm["predicted_n"].(float64))
				assert.GreaterOrEqual(t, n, last, "predicted_n falls: %v", ev)
				if chunkText(ev) != "" {
					texts++
					assert.Greater(t, n, last, "a chunk of text carries at least one new token: %v", ev)
					assert.Positive(t, tm["prompt_n"], "prompt_n: %v", ev)
				}
				last = n
			}
			require.Positive(t, completion, "usage chunk")
			if tc.timings {
				assert.Positive(t, texts)
				assert.Equal(t, completion, last, "the last chunk's predicted_n is the completion's tokens")
			}
		})
	}
}

// chunkText is a streamed chunk's text: a completion's, or a chat delta's content.
func chunkText(ev map[string]any) string {
	out := ""
	for _, c := range ev["choices"].([]any) {
		c := c.(map[string]any)
		if s, ok := c["text"].(string); ok {
			out += s
		}
		if d, ok := c["delta"].(map[string]any); ok {
			if s, ok := d["content"].(string); ok {
				out += s
			}
		}
	}
	return out
}

// docs/openai-api.md's tables and openAIParams are the same list: every documented parameter
// is tested, every tested one documented, with the same status.
func TestParameterTableMatchesDocs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "openai-api.md"))
	require.NoError(t, err)
	documented := map[string]int{} // "api/param" -> 200 or 400
	api := ""
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "## POST /v1/chat/completions"):
			api = "chat"
		case strings.HasPrefix(line, "## POST /v1/completions"):
			api = "completions"
		case strings.HasPrefix(line, "## "):
			api = ""
		}
		cells := strings.Split(line, "|")
		if api == "" || len(cells) < 4 || !strings.Contains(cells[1], "`") {
			continue
		}
		status := map[string]int{"honoured": 200, "accepted": 200, "refused": 400}[strings.TrimSpace(cells[2])]
		require.NotZero(t, status, "status of %q", line)
		for _, p := range strings.Split(cells[1], ",") {
			documented[api+"/"+strings.Trim(strings.TrimSpace(p), "`")] = status
		}
	}
	tested := map[string]int{}
	for _, p := range openAIParams {
		tested[p.api+"/"+p.param] = p.want
	}
	assert.Equal(t, documented, tested)
}
