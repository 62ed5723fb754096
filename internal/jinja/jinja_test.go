package jinja_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/internal/jinja"
)

// renderCase is one template source rendered against data, with the exact
// output expected.
type renderCase struct {
	name   string
	source string
	data   map[string]any
	want   string
}

// mustRender compiles source and renders it against data, failing the test on
// either error.
func mustRender(t *testing.T, source string, data map[string]any) string {
	t.Helper()
	tmpl, err := jinja.Compile(source)
	require.NoError(t, err, "compile")
	out, err := tmpl.Render(data)
	require.NoError(t, err, "render")
	return out
}

// runRenderCases runs each case as a subtest of t.
func runRenderCases(t *testing.T, cases []renderCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, mustRender(t, tc.source, tc.data))
		})
	}
}

// The engine's statements and expressions, each on a small template with no
// model dependency.
func TestRender(t *testing.T) {
	const fromJSONArgs = `{%- set func = tool['function'] -%}
{%- set args = func['arguments'] -%}
{%- if args is string -%}
  {%- set args = args | from_json -%}
{%- endif -%}
{%- for key, val in args.items() -%}{{ key }}={{ val }}{%- endfor -%}`
	toolWithArgs := func(arguments any) map[string]any {
		return map[string]any{"tool": map[string]any{
			"function": map[string]any{"name": "get_weather", "arguments": arguments},
		}}
	}
	runRenderCases(t, []renderCase{
		{name: "variable", source: "Hello {{ name }}!", data: map[string]any{"name": "World"}, want: "Hello World!"},
		{
			name:   "for loop",
			source: `{% for item in items %}{{ item }}{% if not loop.last %}, {% endif %}{% endfor %}`,
			data:   map[string]any{"items": []any{"a", "b", "c"}},
			want:   "a, b, c",
		},
		{name: "if true", source: `{% if x %}yes{% else %}no{% endif %}`, data: map[string]any{"x": true}, want: "yes"},
		{name: "if false", source: `{% if x %}yes{% else %}no{% endif %}`, data: map[string]any{"x": false}, want: "no"},
		{
			name:   "from_json filter",
			source: `{%- set data = data | from_json -%}{{ data.name }}:{{ data.value }}`,
			data:   map[string]any{"data": `{"name":"test","value":42}`},
			want:   "test:42",
		},
		{
			name: "namespace set in a loop",
			source: `{%- set ns = namespace(found=false) -%}
{%- for item in items -%}
{%- if item == "target" -%}
{%- set ns.found = true -%}
{%- endif -%}
{%- endfor -%}
{{ ns.found }}`,
			data: map[string]any{"items": []any{"a", "target", "b"}},
			want: "True",
		},
		{
			// Keys come out sorted, so the output is deterministic.
			name:   "dict items",
			source: `{%- for key, value in data.items() -%}{{ key }}={{ value }} {% endfor -%}`,
			data:   map[string]any{"data": map[string]any{"b": 2, "a": 1}},
			want:   "a=1 b=2 ",
		},
		{name: "from_json on string arguments", source: fromJSONArgs, data: toolWithArgs(`{"location":"New York City, NY"}`), want: "location=New York City, NY"},
		{name: "map arguments pass through", source: fromJSONArgs, data: toolWithArgs(map[string]any{"location": "New York City, NY"}), want: "location=New York City, NY"},
		{
			name: "nested range preserves the outer loop",
			source: `{%- for message in messages -%}
{%- if message['role'] == 'assistant' -%}
{%- set ep = namespace(idx=(loop.index0 - 1), done=false) -%}
{%- for _i in range(loop.index0) -%}
{%- if not ep.done and ep.idx >= 0 -%}
{%- set ep.done = true -%}
{%- endif -%}
{%- endfor -%}
{%- for tool in message['tool_calls'] -%}
{%- set args = tool['function']['arguments'] -%}
{%- if args is string -%}{%- set args = args | from_json -%}{%- endif -%}
{%- for key, val in args.items() -%}{{ key }}={{ val }}{%- endfor -%}
{%- endfor -%}
{%- endif -%}
{%- endfor -%}`,
			data: map[string]any{"messages": []map[string]any{
				{"role": "user", "content": "weather"},
				{"role": "assistant", "tool_calls": []map[string]any{{"function": map[string]any{
					"name":      "get_weather",
					"arguments": map[string]any{"location": "New York City, NY"},
				}}}},
				{"role": "tool", "content": `{"temperature":"72°F"}`},
			}},
			want: "location=New York City, NY",
		},
		{name: "inline if", source: `{{ "yes" if x else "no" }}`, data: map[string]any{"x": true}, want: "yes"},
		// "-" strips the whitespace before a tag and, as with HuggingFace's
		// trim_blocks, the newline after a block tag goes too.
		{name: "whitespace control", source: "A\n  {%- if true %}\nB\n  {%- endif %}\nC", want: "ABC"},
		{name: "reverse slice", source: `{{ items[::-1] | join(",") }}`, data: map[string]any{"items": []any{"a", "b", "c"}}, want: "c,b,a"},
		{name: "string concat", source: `{{ "Hello" ~ " " ~ "World" }}`, want: "Hello World"},
		{
			name:   "loop variables",
			source: `{%- for item in items -%}{{ loop.index0 }}:{{ item }} {% endfor -%}`,
			data:   map[string]any{"items": []any{"x", "y", "z"}},
			want:   "0:x 1:y 2:z ",
		},
	})
}

func TestTojsonFilter(t *testing.T) {
	data := map[string]any{"data": map[string]any{"name": "test", "values": []int{1, 2}}}
	runRenderCases(t, []renderCase{
		{name: "default separators", source: `{{ data | tojson }}`, data: data, want: `{"name": "test", "values": [1, 2]}`},
		{name: "compact separators", source: `{{ data | tojson(separators=[',', ':']) }}`, data: data, want: `{"name":"test","values":[1,2]}`},
	})
}

func TestUndefinedCallableErrorNamesExpression(t *testing.T) {
	tmpl, err := jinja.Compile(`{{ args.items() }}`)
	require.NoError(t, err)
	_, err = tmpl.Render(nil)
	require.EqualError(t, err, "args.items is not callable: Undefined")
}

func TestStringMethods(t *testing.T) {
	runRenderCases(t, []renderCase{
		{name: "strip", source: `{{ "  hello  ".strip() }}`, want: "hello"},
		{name: "split", source: `{{ "a,b,c".split(",") | join("-") }}`, want: "a-b-c"},
		{name: "startswith", source: `{{ "hello".startswith("hel") }}`, want: "True"},
		{name: "endswith", source: `{{ "hello".endswith("llo") }}`, want: "True"},
		{name: "upper", source: `{{ "hello".upper() }}`, want: "HELLO"},
		{name: "lower", source: `{{ "HELLO".lower() }}`, want: "hello"},
		{name: "replace", source: `{{ "hello world".replace("world", "jinja") }}`, want: "hello jinja"},
	})
}

func TestIsTests(t *testing.T) {
	data := map[string]any{"x": "hello", "n": nil, "t": true, "f": false}
	runRenderCases(t, []renderCase{
		{name: "is defined", source: `{{ "yes" if x is defined else "no" }}`, data: data, want: "yes"},
		{name: "is not defined", source: `{{ "yes" if y is not defined else "no" }}`, data: data, want: "yes"},
		{name: "is string", source: `{{ "yes" if x is string else "no" }}`, data: data, want: "yes"},
		{name: "is none", source: `{{ "yes" if n is none else "no" }}`, data: data, want: "yes"},
		{name: "is true", source: `{{ "yes" if t is true else "no" }}`, data: data, want: "yes"},
		{name: "is false", source: `{{ "yes" if f is false else "no" }}`, data: data, want: "yes"},
	})
}

// TestDictGet covers dict.get(), the method gonja lacks ("unknown method 'get'")
// and that chat templates lean on.
func TestDictGet(t *testing.T) {
	alice := map[string]any{"d": map[string]any{"name": "Alice"}}
	runRenderCases(t, []renderCase{
		{name: "get existing key", source: `{{ d.get('name') }}`, data: alice, want: "Alice"},
		{name: "get missing key returns none", source: `{{ d.get('missing') }}`, data: alice, want: ""},
		{name: "get missing key with default", source: `{{ d.get('missing', 'fallback') }}`, data: alice, want: "fallback"},
		{name: "get in or chain", source: `{{ d.get('a') or d.get('b') or 'none' }}`, data: map[string]any{"d": map[string]any{"b": "found_b"}}, want: "found_b"},
		{name: "get in if condition", source: `{% if d.get('tool_calls') %}yes{% else %}no{% endif %}`, data: alice, want: "no"},
		{
			name:   "get truthy check",
			source: `{% if d.get('tool_calls') %}yes{% else %}no{% endif %}`,
			data:   map[string]any{"d": map[string]any{"tool_calls": []any{"call1"}}},
			want:   "yes",
		},
	})
}

func TestDefaultFilterBoolean(t *testing.T) {
	runRenderCases(t, []renderCase{
		{name: "falsey value without boolean remains", source: `{{ value | default('fallback') }}`, data: map[string]any{"value": ""}},
		{name: "falsey value with positional boolean uses default", source: `{{ value | default('fallback', true) }}`, data: map[string]any{"value": ""}, want: "fallback"},
		{name: "truthy value with positional boolean remains", source: `{{ value | default('fallback', true) }}`, data: map[string]any{"value": "actual"}, want: "actual"},
		{name: "falsey value with keyword boolean uses default", source: `{{ value | default('fallback', boolean=true) }}`, data: map[string]any{"value": false}, want: "fallback"},
	})
}

// helloChat is one user turn saying "Hello!"; thinking sets enable_thinking
// for the templates that read it.
func helloChat(thinking bool) map[string]any {
	data := map[string]any{
		"messages": []any{
			map[string]any{"role": "user", "content": "Hello!"},
		},
		"add_generation_prompt": true,
	}
	if thinking {
		data["enable_thinking"] = true
	}
	return data
}

// weatherTool is the get_weather function declaration the tool-calling
// requests offer.
func weatherTool() []any {
	return []any{
		map[string]any{
			"type": "function",
			"function": map[string]any{
				"name":        "get_weather",
				"description": "Get the current weather for a location",
				"parameters": map[string]any{
					"type": "object",
					"properties": map[string]any{
						"location": map[string]any{
							"type":        "string",
							"description": "The location to get weather for",
						},
					},
					"required": []any{"location"},
				},
			},
		},
	}
}

// weatherChat is one user turn asking for London's weather with get_weather
// offered.
func weatherChat(thinking bool) map[string]any {
	data := map[string]any{
		"messages": []any{
			map[string]any{"role": "user", "content": "What is the weather in London?"},
		},
		"tools":                 weatherTool(),
		"add_generation_prompt": true,
	}
	if thinking {
		data["enable_thinking"] = true
	}
	return data
}

// multiTurnToolChat is a conversation with an assistant tool call, its tool
// response and a follow-up question: the path that reads
// message.get('reasoning'), message.get('tool_calls') and
// message.get('content') in Gemma 4's template.
func multiTurnToolChat() map[string]any {
	return map[string]any{
		"messages": []any{
			map[string]any{"role": "user", "content": "What is the weather in London?"},
			map[string]any{
				"role":    "assistant",
				"content": "",
				"tool_calls": []any{
					map[string]any{
						"id":   "call_1",
						"type": "function",
						"function": map[string]any{
							"name":      "get_weather",
							"arguments": `{"location": "London"}`,
						},
					},
				},
			},
			map[string]any{
				"role":         "tool",
				"tool_call_id": "call_1",
				"name":         "get_weather",
				"content":      `{"temperature": 15, "condition": "cloudy"}`,
			},
			map[string]any{"role": "assistant", "content": "The weather in London is 15°C and cloudy."},
			map[string]any{"role": "user", "content": "What about Paris?"},
		},
		"tools":                 weatherTool(),
		"add_generation_prompt": true,
		"enable_thinking":       true,
	}
}

// Real chat templates under testdata/templates render the requests a chat
// sends, and their output carries the parts each request put in.
func TestRenderChatTemplates(t *testing.T) {
	const (
		qwen3    = "Qwen3-8B-Q8_0"
		gptOSS   = "gpt-oss-20b-Q8_0"
		qwen35   = "Qwen3.5-35B-A3B-Q8_0"
		gemma4   = "gemma-4-26B-A4B-it-UD-Q8_K_XL"
		hello    = "Hello!"
		toolName = "get_weather"
	)
	for _, tc := range []struct {
		name     string
		template string
		data     map[string]any
		contains []string
	}{
		{name: "Qwen3-8B simple chat", template: qwen3, data: helloChat(true), contains: []string{hello, "user", "assistant"}},
		{name: "gpt-oss-20b simple chat", template: gptOSS, data: helloChat(false), contains: []string{hello}},
		{name: "Qwen3.5-35B simple chat", template: qwen35, data: helloChat(true), contains: []string{hello}},
		{name: "Qwen3-8B tool calling", template: qwen3, data: weatherChat(true), contains: []string{toolName, "London"}},
		{name: "gpt-oss-20b tool calling", template: gptOSS, data: weatherChat(false), contains: []string{toolName}},
		{name: "Qwen3.5-35B tool calling", template: qwen35, data: weatherChat(true), contains: []string{toolName}},
		{name: "Gemma 4 simple chat", template: gemma4, data: helloChat(true), contains: []string{hello, "model", "user"}},
		{name: "Ministral 3 simple chat", template: "Ministral-3-14B-Instruct-2512-Q4_0", data: helloChat(false), contains: []string{hello}},
		{name: "rnj-1 simple chat", template: "rnj-1-instruct-Q6_K", data: helloChat(false), contains: []string{hello}},
		{name: "LFM2.5-VL simple chat", template: "LFM2.5-VL-1.6B-Q8_0", data: helloChat(false), contains: []string{hello}},
		{name: "Gemma 4 tool calling", template: gemma4, data: weatherChat(true), contains: []string{toolName, "London"}},
		{
			// gonja fails on this one: assistant tool_calls followed by tool
			// responses, across turns.
			name:     "Gemma 4 multi-turn tool call",
			template: gemma4,
			data:     multiTurnToolChat(),
			contains: []string{toolName, "London", "Paris", "tool_call", "tool_response"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			source, ok := chatTemplates[tc.template]
			require.True(t, ok, "no template %s under testdata/templates", tc.template)
			out := mustRender(t, source, tc.data)
			t.Logf("%s output:\n%s", tc.template, out)
			for _, want := range tc.contains {
				assert.Contains(t, out, want)
			}
		})
	}
}

func TestRegression(t *testing.T) {
	for name, content := range chatTemplates {
		t.Run(name, func(t *testing.T) {
			_, err := jinja.Compile(content)
			require.NoError(t, err, "compile")
		})
	}
}

var chatTemplates map[string]string

func init() {
	files, err := filepath.Glob("testdata/templates/*.jinja")
	if err != nil {
		panic(fmt.Sprintf("error: can't read testdata/templates - %v", err))
	}

	chatTemplates = make(map[string]string)
	suffixLen := len(".jinja")

	for _, fileName := range files {
		data, err := os.ReadFile(fileName)
		if err != nil {
			panic(fmt.Sprintf("error: %q - read: %v", fileName, err))
		}

		name := filepath.Base(fileName)
		name = name[:len(name)-suffixLen]
		chatTemplates[name] = string(data)
	}
}
