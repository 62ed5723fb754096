package serve

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestParseToolCalls(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []toolCall // nil: not a tool call
	}{
		{"llama 3 parameters", `{"name": "get_weather", "parameters": {"city": "Paris"}}`,
			[]toolCall{{"get_weather", `{"city": "Paris"}`}}},
		{"llama 3 python tag", "<|python_tag|>{\"name\": \"f\", \"arguments\": {}}",
			[]toolCall{{"f", `{}`}}},
		{"llama 3 two calls", `{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}`,
			[]toolCall{{"a", `{"x": 1}`}, {"b", `{}`}}},
		{"hermes", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}\n</tool_call>",
			[]toolCall{{"f", `{"q": "x"}`}}},
		{"hermes two", "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": {\"n\": 2}}</tool_call>",
			[]toolCall{{"a", `{}`}, {"b", `{"n": 2}`}}},
		{"hermes unclosed", "<tool_call>{\"name\": \"a\", \"arguments\": {}}", []toolCall{{"a", `{}`}}},
		{"mistral", `[TOOL_CALLS][{"name": "f", "arguments": {"a": [1, 2]}}, {"name": "g", "arguments": "{\"s\":1}"}]`,
			[]toolCall{{"f", `{"a": [1, 2]}`}, {"g", `{"s":1}`}}},
		{"plain text", "The weather is fine.", nil},
		{"json without name", `{"city": "Paris"}`, nil},
		{"json then text", `{"name": "f", "parameters": {}} and more`, nil},
		{"hermes then text", "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call> done", nil},
		{"broken json", `{"name": "f", "parameters": {`, nil},
		{"mistral broken", `[TOOL_CALLS][{"name": "f"`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseToolCalls(tc.text)
			assert.Equal(t, tc.want != nil, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestMayBeToolCall(t *testing.T) {
	for text, want := range map[string]bool{
		"": true, "  ": true, "<tool": true, "<tool_call>{": true, "[TOOL": true, "{\"na": true,
		"<|python": true, "Hello": false, "<b>": false, " The": false,
	} {
		assert.Equal(t, want, mayBeToolCall(text), "%q", text)
	}
}
