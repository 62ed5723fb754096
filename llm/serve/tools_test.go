package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/prompt"
)

const weatherTool = `{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}`

// newToolServer serves stories260K with a Llama-3.1-style template that renders tools; reply,
// when set, replaces the model's answer.
func newToolServer(t *testing.T, reply string) (string, *Server) {
	src, err := os.ReadFile("testdata/llama31_tools.jinja")
	require.NoError(t, err)
	// the template's tool prompt is long for stories260K's small vocabulary: a larger context
	eng, err := llm.Load(context.Background(), storiesPath(t), llm.WithReferenceFallback(),
		llm.WithRunnerOptions(llm.WithContextLength(1536)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = eng.Close() })
	srv, err := New(context.Background(), eng, WithModelName("stories"), WithMaxTokens(64), WithChatOptions(llm.WithChatTemplate(string(src))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	if reply != "" { // before the server starts: its handlers read the hook
		srv.hooks.reply = func() string { return reply }
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs.URL, srv
}

// The template receives the tools and an earlier turn's tool calls as Hugging Face passes
// them; a real request with tools renders and generates.
func TestToolsRendered(t *testing.T) {
	url, srv := newToolServer(t, "")
	var tool map[string]any
	require.NoError(t, json.Unmarshal([]byte(weatherTool), &tool))
	msgs := []prompt.Message{
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: []prompt.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		{Role: "tool", Content: `{"temp": 21}`, ToolCallID: "call_1"},
	}
	out, err := srv.tmpl.RenderToolsContext(context.Background(), msgs, []any{tool}, true)
	require.NoError(t, err)
	assert.Contains(t, out, "Environment: ipython")
	assert.Contains(t, out, `"name": "get_weather"`, "the tool is in the prompt")
	assert.Contains(t, out, `"description": "Weather of a city"`)
	assert.Contains(t, out, `{"name": "get_weather", "parameters": {"city": "Paris"}}`, "the earlier call")
	// a string is iterable in Jinja, so Llama 3.1's template writes a tool's string result as JSON
	assert.Contains(t, out, "<|start_header_id|>ipython<|end_header_id|>\n\n\"{\\\"temp\\\": 21}\"")
	plain, err := srv.tmpl.RenderToolsContext(context.Background(), msgs[:1], nil, true)
	require.NoError(t, err)
	assert.NotContains(t, plain, "get_weather")

	body := `{"model":"stories","max_tokens":4,"tools":[` + weatherTool + `],"messages":[{"role":"user","content":"Weather in Paris?"}]}`
	code, b := post(t, url+"/v1/chat/completions", body)
	require.Equal(t, 200, code, string(b))
	var withTools, without struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		}
	}
	require.NoError(t, json.Unmarshal(b, &withTools))
	code, b = post(t, url+"/v1/chat/completions", strings.Replace(body, `"tools"`, `"tool_choice":"none","tools"`, 1))
	require.Equal(t, 200, code, string(b))
	require.NoError(t, json.Unmarshal(b, &without))
	assert.Greater(t, withTools.Usage.PromptTokens, without.Usage.PromptTokens+20, "tool_choice none renders no tools")

	for _, bad := range []struct{ body, param string }{
		{`"tools":[{"type":"function"}]`, "tools[0]"},
		{`"tools":[{"type":"function","function":{}}]`, "tools[0].function.name"},
	} {
		code, b := post(t, url+"/v1/chat/completions", `{"model":"stories",`+bad.body+`,"messages":[{"role":"user","content":"x"}]}`)
		assert.Equal(t, 400, code, bad.body)
		assert.Contains(t, string(b), `"param":"`+bad.param+`"`, string(b))
	}
}

// A model's reply in each family's format comes back as tool_calls, whole and streamed; a
// plain reply stays content.
func TestToolCallsAnswered(t *testing.T) {
	for _, tc := range []struct {
		name, reply string
		calls       [][2]string // name, arguments; nil: content
	}{
		{"llama 3", `{"name": "get_weather", "parameters": {"city": "Paris"}}`, [][2]string{{"get_weather", `{"city": "Paris"}`}}},
		{"hermes", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>", [][2]string{{"get_weather", `{"city": "Oslo"}`}}},
		{"mistral two", `[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]`, [][2]string{{"a", `{}`}, {"b", `{"x": 1}`}}},
		{"plain", "It is sunny in Paris.", nil},
		{"brace but not a call", `{"city": "Paris"}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, _ := newToolServer(t, tc.reply)
			body := `{"model":"stories","tools":[` + weatherTool + `],"messages":[{"role":"user","content":"Weather?"}]`
			code, b := post(t, url+"/v1/chat/completions", body+`}`)
			require.Equal(t, 200, code, string(b))
			var whole struct {
				Choices []struct {
					Message struct {
						Content   *string
						ToolCalls []struct {
							ID, Type string
							Function struct{ Name, Arguments string }
						} `json:"tool_calls"`
					}
					FinishReason string `json:"finish_reason"`
				}
			}
			require.NoError(t, json.Unmarshal(b, &whole), string(b))
			m := whole.Choices[0].Message
			if tc.calls == nil {
				require.NotNil(t, m.Content)
				assert.Equal(t, tc.reply, *m.Content)
				assert.Empty(t, m.ToolCalls)
				assert.Equal(t, "stop", whole.Choices[0].FinishReason)
			} else {
				assert.Nil(t, m.Content)
				assert.Equal(t, "tool_calls", whole.Choices[0].FinishReason)
				require.Len(t, m.ToolCalls, len(tc.calls))
				for i, c := range tc.calls {
					assert.Equal(t, "function", m.ToolCalls[i].Type)
					assert.True(t, strings.HasPrefix(m.ToolCalls[i].ID, "call_"))
					assert.Equal(t, c[0], m.ToolCalls[i].Function.Name)
					assert.Equal(t, c[1], m.ToolCalls[i].Function.Arguments)
				}
			}

			resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body+`,"stream":true}`))
			require.NoError(t, err)
			defer resp.Body.Close()
			events, done := readSSE(t, resp.Body)
			require.True(t, done)
			var content, finish string
			var calls [][2]string
			for _, ev := range events {
				for _, c := range ev["choices"].([]any) {
					c := c.(map[string]any)
					d := c["delta"].(map[string]any)
					if s, ok := d["content"].(string); ok {
						content += s
					}
					if tcs, ok := d["tool_calls"].([]any); ok {
						for i, x := range tcs {
							x := x.(map[string]any)
							assert.EqualValues(t, len(calls), x["index"], "call %d", i)
							f := x["function"].(map[string]any)
							calls = append(calls, [2]string{f["name"].(string), f["arguments"].(string)})
						}
					}
					if f, ok := c["finish_reason"].(string); ok {
						finish = f
					}
				}
			}
			if tc.calls == nil {
				assert.Equal(t, tc.reply, content)
				assert.Equal(t, "stop", finish)
			} else {
				assert.Empty(t, content, "a tool call is not streamed as content")
				assert.Equal(t, tc.calls, calls)
				assert.Equal(t, "tool_calls", finish)
			}
		})
	}
}

// The openai npm client parses the server's tool calls, whole and streamed (its stream helper
// assembles delta.tool_calls), and sends the call and its result back as history.
func TestOpenAIClientToolCalls(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed (scripts/deps.sh installs it)")
	}
	npmDir, err := filepath.Abs(filepath.Join("..", "..", "build", "npm"))
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(npmDir, "node_modules", "openai")); err != nil {
		t.Skipf("the openai npm package is not in %s: run scripts/deps.sh", npmDir)
	}
	script, err := os.ReadFile(filepath.Join("testdata", "openai_tools.mjs"))
	require.NoError(t, err)
	scriptPath := filepath.Join(npmDir, fmt.Sprintf("openai_tools_%d.mjs", os.Getpid()))
	require.NoError(t, os.WriteFile(scriptPath, script, 0o644))
	defer os.Remove(scriptPath)

	url, _ := newToolServer(t, `<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, node, scriptPath, url+"/v1", "stories").Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("node client failed: %v\n%s", err, ee.Stderr)
	}
	require.NoError(t, err)
	type call struct {
		ID, Type, Name string
		Args           map[string]any
	}
	var got struct {
		Whole struct {
			Finish  string
			Content *string
			Calls   []call
		}
		Stream struct {
			Finish string
			Calls  []call
		}
		Next struct{ Finish string }
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	assert.Equal(t, "tool_calls", got.Whole.Finish)
	assert.Nil(t, got.Whole.Content)
	require.Len(t, got.Whole.Calls, 1)
	assert.Equal(t, "function", got.Whole.Calls[0].Type)
	assert.Equal(t, "get_weather", got.Whole.Calls[0].Name)
	assert.Equal(t, map[string]any{"city": "Paris"}, got.Whole.Calls[0].Args)
	assert.Equal(t, "tool_calls", got.Stream.Finish)
	require.Len(t, got.Stream.Calls, 1)
	assert.Equal(t, "get_weather", got.Stream.Calls[0].Name)
	assert.Equal(t, map[string]any{"city": "Paris"}, got.Stream.Calls[0].Args)
	assert.Equal(t, "tool_calls", got.Next.Finish)
}

// tool_choice "required" or a named function holds the real model's reply to a call of the
// tools' schema (a grammar), in the template's format: Llama 3's JSON, Hermes's <tool_call>.
func TestToolChoiceForcesACall(t *testing.T) {
	hermes := "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}" +
		"<tool_call>\n{\"name\": \"{{ c.function.name }}\"}\n</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n" +
		"{% endfor %}{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
	llama, err := os.ReadFile("testdata/llama31_tools.jinja")
	require.NoError(t, err)
	tools := `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":6},"unit":{"enum":["c","f"]}},"required":["city","unit"]}}},` +
		`{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string","maxLength":4}},"required":["zone"]}}}]`
	for _, tc := range []struct{ name, template, choice, want string }{
		{"llama 3 required", string(llama), `"required"`, ""},
		{"llama 3 named", string(llama), `{"type":"function","function":{"name":"get_time"}}`, "get_time"},
		{"hermes named", hermes, `{"type":"function","function":{"name":"get_weather"}}`, "get_weather"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng, err := llm.Load(context.Background(), storiesPath(t), llm.WithReferenceFallback(),
				llm.WithRunnerOptions(llm.WithContextLength(1536)))
			require.NoError(t, err)
			t.Cleanup(func() { _ = eng.Close() })
			srv, err := New(context.Background(), eng, WithModelName("stories"), WithMaxTokens(200), WithChatOptions(llm.WithChatTemplate(tc.template)))
			require.NoError(t, err)
			t.Cleanup(func() { _ = srv.Close() })
			hs := httptest.NewServer(srv.Handler())
			t.Cleanup(hs.Close)
			for seed := range 2 {
				body := fmt.Sprintf(`{"model":"stories","max_tokens":200,"seed":%d,"tools":%s,"tool_choice":%s,"messages":[{"role":"user","content":"Weather?"}]}`, seed, tools, tc.choice)
				code, b := post(t, hs.URL+"/v1/chat/completions", body)
				require.Equal(t, 200, code, string(b))
				var out struct {
					Choices []struct {
						Message struct {
							ToolCalls []struct {
								Function struct{ Name, Arguments string }
							} `json:"tool_calls"`
						}
						FinishReason string `json:"finish_reason"`
					}
				}
				require.NoError(t, json.Unmarshal(b, &out))
				require.Equal(t, "tool_calls", out.Choices[0].FinishReason, string(b))
				require.Len(t, out.Choices[0].Message.ToolCalls, 1)
				f := out.Choices[0].Message.ToolCalls[0].Function
				if tc.want != "" {
					assert.Equal(t, tc.want, f.Name)
				}
				var args map[string]any
				require.NoError(t, json.Unmarshal([]byte(f.Arguments), &args), f.Arguments)
				if f.Name == "get_weather" {
					assert.Contains(t, []any{"c", "f"}, args["unit"])
					assert.LessOrEqual(t, len(args["city"].(string)), 6)
				} else {
					assert.Contains(t, args, "zone")
				}
			}
		})
	}
	// a tool_choice that names no tool, or requires a call without tools, is a 400
	url, _ := newToolServer(t, "")
	for _, body := range []string{
		`"tools":` + tools + `,"tool_choice":{"type":"function","function":{"name":"nope"}}`,
		`"tool_choice":"required"`,
		`"tools":` + tools + `,"tool_choice":"sometimes"`,
	} {
		code, b := post(t, url+"/v1/chat/completions", `{"model":"stories",`+body+`,"messages":[{"role":"user","content":"x"}]}`)
		assert.Equal(t, 400, code, body)
		assert.Contains(t, string(b), `"param":"tool_choice"`, string(b))
	}
}
