package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/grammar"
	"github.com/xpuhub/xpu/llm/prompt"
)

// Tool calls come back from a model as text in its family's format; parseToolCalls reads the
// three that chat templates define:
//   - Hermes and Qwen: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one per call;
//   - Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...];
//   - Llama 3.x: the whole reply one JSON object {"name": ..., "parameters": {...}} (or
//     "arguments"), optionally after <|python_tag|>, several separated by ";".

// toolCall is one parsed call: the function's name and its arguments as JSON text (OpenAI
// sends arguments as a string).
type toolCall struct {
	Name      string
	Arguments string
}

// toolCallStarts are the texts a reply that is a tool call starts with.
var toolCallStarts = []string{"<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "{"}

// mayBeToolCall says whether text (a reply's beginning) could still turn out to be a tool
// call, so that a stream holds it back rather than sending it as content.
func mayBeToolCall(text string) bool {
	t := strings.TrimLeft(text, " \t\r\n")
	if t == "" {
		return true
	}
	for _, s := range toolCallStarts {
		if strings.HasPrefix(t, s) || strings.HasPrefix(s, t) {
			return true
		}
	}
	return false
}

// parseToolCalls reads the tool calls of a whole reply; ok is false when the reply is not
// (only) tool calls, and is then plain content.
func parseToolCalls(text string) (calls []toolCall, ok bool) {
	t := strings.TrimSpace(text)
	switch {
	case strings.HasPrefix(t, "<tool_call>"):
		for t != "" {
			if !strings.HasPrefix(t, "<tool_call>") {
				return nil, false
			}
			body, rest, found := strings.Cut(strings.TrimPrefix(t, "<tool_call>"), "</tool_call>")
			if !found { // the model stopped before closing the last one: take what is whole
				rest = ""
			}
			c, ok := parseCall(body)
			if !ok {
				return nil, false
			}
			calls = append(calls, c)
			t = strings.TrimSpace(rest)
		}
		return calls, len(calls) > 0
	case strings.HasPrefix(t, "[TOOL_CALLS]"):
		var list []json.RawMessage
		if json.Unmarshal([]byte(strings.TrimSpace(strings.TrimPrefix(t, "[TOOL_CALLS]"))), &list) != nil {
			return nil, false
		}
		for _, raw := range list {
			c, ok := parseCall(string(raw))
			if !ok {
				return nil, false
			}
			calls = append(calls, c)
		}
		return calls, len(calls) > 0
	}
	t = strings.TrimSpace(strings.TrimPrefix(t, "<|python_tag|>"))
	if !strings.HasPrefix(t, "{") {
		return nil, false
	}
	dec := json.NewDecoder(strings.NewReader(t))
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		c, ok := parseCall(string(raw))
		if !ok {
			return nil, false
		}
		calls = append(calls, c)
		rest := strings.TrimSpace(t[dec.InputOffset():])
		if rest == "" {
			return calls, true
		}
		if !strings.HasPrefix(rest, ";") {
			return nil, false
		}
		t = strings.TrimSpace(rest[1:])
		dec = json.NewDecoder(strings.NewReader(t))
	}
}

// parseCall reads {"name": ..., "arguments" or "parameters": {...}}.
func parseCall(s string) (toolCall, bool) {
	var c struct {
		Name       string          `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
	}
	if json.Unmarshal([]byte(strings.TrimSpace(s)), &c) != nil || c.Name == "" {
		return toolCall{}, false
	}
	args := c.Arguments
	if len(args) == 0 {
		args = c.Parameters
	}
	if len(args) == 0 || isNull(args) {
		args = json.RawMessage("{}")
	}
	// arguments a model wrote as a JSON string holding JSON stay that string
	var str string
	if json.Unmarshal(args, &str) == nil {
		return toolCall{Name: c.Name, Arguments: str}, true
	}
	return toolCall{Name: c.Name, Arguments: string(args)}, true
}

// checkTools validates a chat request's tools and tool_choice and returns the tools the
// template is given (nil: none, also for tool_choice "none") and, when tool_choice requires a
// call ("required" or a named function), the functions the call may name.
func checkTools(tools []any, choice json.RawMessage) ([]any, []map[string]any, *apiError) {
	fns := make([]map[string]any, len(tools))
	for i, t := range tools {
		m, _ := t.(map[string]any)
		f, _ := m["function"].(map[string]any)
		if m["type"] != "function" || f == nil {
			return nil, nil, badRequest(fmt.Sprintf("tools[%d]", i), "invalid_value", `tools[%d]: must be {"type": "function", "function": {...}}`, i)
		}
		if name, _ := f["name"].(string); name == "" {
			return nil, nil, badRequest(fmt.Sprintf("tools[%d].function.name", i), "invalid_value", "tools[%d]: the function needs a name", i)
		}
		fns[i] = f
	}
	if isNull(choice) || len(choice) == 0 || oneOf(`"auto"`)(choice) {
		if len(tools) == 0 {
			return nil, nil, nil
		}
		return tools, nil, nil
	}
	if oneOf(`"none"`)(choice) {
		return nil, nil, nil
	}
	if len(tools) == 0 {
		return nil, nil, badRequest("tool_choice", "invalid_value", "tool_choice requires a call but the request has no tools")
	}
	if oneOf(`"required"`)(choice) {
		return tools, fns, nil
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(choice, &named) != nil || named.Type != "function" || named.Function.Name == "" {
		return nil, nil, badRequest("tool_choice", "invalid_value", `tool_choice: must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}`)
	}
	for _, f := range fns {
		if f["name"] == named.Function.Name {
			return tools, []map[string]any{f}, nil
		}
	}
	return nil, nil, badRequest("tool_choice", "invalid_value", "tool_choice names %q, which is not among the tools", named.Function.Name)
}

// callGrammar is the grammar that holds a reply to one call of fns in the format the chat
// template writes calls in (found by rendering a call with it): Hermes/Qwen's <tool_call>
// tags, or Llama 3's bare JSON with "parameters". Each function's parameters schema becomes the
// arguments' (a schema the converter cannot express is a 400 naming the tool).
func (s *Server) callGrammar(ctx context.Context, fns []map[string]any) (*grammar.Grammar, *apiError) {
	probe := []prompt.Message{{Role: "user", Content: "x"},
		{Role: "assistant", ToolCalls: []prompt.ToolCall{{ID: "call_0", Name: "xpu_probe", Arguments: "{}"}}}}
	rendered, _ := s.tmpl.RenderToolsContext(ctx, probe, []any{map[string]any{"type": "function",
		"function": map[string]any{"name": "xpu_probe", "parameters": map[string]any{"type": "object"}}}}, false)
	hermes := strings.Contains(rendered, "<tool_call>")
	if strings.Contains(rendered, "[TOOL_CALLS]") {
		return nil, badRequest("tool_choice", "unsupported_value", "tool_choice: forcing a call in Mistral's [TOOL_CALLS] format is not supported (use \"auto\")")
	}
	argKey := "parameters"
	if hermes {
		argKey = "arguments"
	}
	var alts []any
	for _, f := range fns {
		params := f["parameters"]
		if params == nil {
			params = map[string]any{"type": "object"}
		}
		alts = append(alts, map[string]any{"type": "object",
			"properties": map[string]any{"name": map[string]any{"const": f["name"]}, argKey: params},
			"required":   []string{"name", argKey}})
	}
	schema, err := json.Marshal(map[string]any{"anyOf": alts})
	if err != nil {
		return nil, badRequest("tools", "invalid_value", "tools: %v", err)
	}
	src, err := grammar.SchemaGBNF(schema)
	if err != nil {
		return nil, badRequest("tools", "invalid_value", "tools: a parameters schema cannot be enforced for tool_choice: %v", err)
	}
	if hermes {
		src = strings.Replace(src, "root ::=", "call ::=", 1) + "\nroot ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\n"
	}
	g, err := grammar.Parse(src)
	if err != nil {
		return nil, newError(http.StatusInternalServerError, "server_error", "tools", "", "the tool-call grammar does not compile: %v", err)
	}
	return g, nil
}

// apiToolCalls are calls in OpenAI's shape; streamed ones carry their index.
func apiToolCalls(calls []toolCall, streamed bool) []apiToolCall {
	out := make([]apiToolCall, len(calls))
	for i, c := range calls {
		out[i].ID, out[i].Type = newID("call_"), "function"
		out[i].Function.Name, out[i].Function.Arguments = c.Name, c.Arguments
		if streamed {
			out[i].Index = ptr(i)
		}
	}
	return out
}

// replyOr is gen, or, when a test set the reply hook, a generation that writes the hook's
// text to stream (nil: unstreamed) in pieces of a few bytes.
func (s *Server) replyOr(gen generateFunc, stream func(string) error) generateFunc {
	if s.hooks.reply == nil {
		return gen
	}
	return func(context.Context, *slot, []llm.GenerateOption) (llm.Result, error) {
		text := s.hooks.reply()
		res := llm.Result{Text: text, Stop: llm.StopEOS}
		for i := 0; i < len(text); i += 3 {
			res.Tokens = append(res.Tokens, 0)
			if stream != nil {
				if err := stream(text[i:min(i+3, len(text))]); err != nil {
					return res, err
				}
			}
		}
		return res, nil
	}
}
