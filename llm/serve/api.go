package serve

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/xpuhub/xpu/llm"
)

// The request and response shapes of the OpenAI API the server speaks. Fields nobody defined
// are ignored; known ones the server cannot honour are refused (params.go).

// stringOrList is a JSON string or array of strings ("stop", "prompt").
type stringOrList []string

func (s *stringOrList) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*s = nil
		return nil
	}
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("must be a string or an array of strings")
	}
	*s = many
	return nil
}

// content is a message's content: a string, or an array of parts of which only text parts
// are accepted.
type content string

func (c *content) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*c = ""
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*c = content(s)
		return nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return fmt.Errorf("must be a string or an array of content parts")
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return fmt.Errorf("content part type %q: only text parts are supported", p.Type)
		}
		sb.WriteString(p.Text)
	}
	*c = content(sb.String())
	return nil
}

type chatMessage struct {
	Role       string        `json:"role"`
	Content    content       `json:"content"`
	ToolCalls  []apiToolCall `json:"tool_calls,omitempty"`
	ToolCallID string        `json:"tool_call_id,omitempty"`
}

// apiToolCall is OpenAI's tool call: in a message, and (with Index) in a streamed delta.
type apiToolCall struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// replyMessage is the assistant's message of an answer: content null when it calls tools.
type replyMessage struct {
	Role      string        `json:"role"`
	Content   *string       `json:"content"`
	ToolCalls []apiToolCall `json:"tool_calls,omitempty"`
}

// sampling is what both endpoints share.
type sampling struct {
	knobs
	Model               string       `json:"model"`
	MaxTokens           *int         `json:"max_tokens"`
	MaxCompletionTokens *int         `json:"max_completion_tokens"`
	Stop                stringOrList `json:"stop"`
	Stream              bool         `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N              *int            `json:"n"`
	ResponseFormat *responseFormat `json:"response_format"`
	// TimingsPerToken is llama-server's extension: every streamed chunk carries timings, whose
	// predicted_n counts the tokens generated so far (a chunk may carry several, or a token no
	// text until the next completes a character).
	TimingsPerToken bool `json:"timings_per_token"`
}

// responseFormat is OpenAI's response_format: text, json_object (any JSON object) or
// json_schema (JSON that the schema accepts); the last two hold generation to a grammar.
type responseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Strict *bool           `json:"strict"`
	} `json:"json_schema"`
}

type chatRequest struct {
	sampling
	Messages    []chatMessage   `json:"messages"`
	Tools       []any           `json:"tools"`
	ToolChoice  json.RawMessage `json:"tool_choice"`
	Logprobs    *bool           `json:"logprobs"`
	TopLogprobs *int            `json:"top_logprobs"`
}

type completionRequest struct {
	sampling
	Prompt   stringOrList `json:"prompt"`
	Logprobs *int         `json:"logprobs"` // the completions API's: how many alternatives, 0 to 5
	Echo     bool         `json:"echo"`
	BestOf   *int         `json:"best_of"`
}

// chatLogprobs is a chat choice's logprobs: one entry per generated token.
type chatLogprobs struct {
	Content []tokenLogprob `json:"content"`
	Refusal []tokenLogprob `json:"refusal"`
}

type tokenLogprob struct {
	Token       string         `json:"token"`
	Logprob     float64        `json:"logprob"`
	Bytes       []int          `json:"bytes"`
	TopLogprobs []tokenLogprob `json:"top_logprobs,omitempty"`
}

// textLogprobs is a completions choice's logprobs (the legacy shape).
type textLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptDetails says how many prompt tokens were found in a runner's cache, not prefilled.
	PromptDetails promptDetails `json:"prompt_tokens_details"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      *replyMessage `json:"message,omitempty"`
	Delta        *delta        `json:"delta,omitempty"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type delta struct {
	Role      string        `json:"role,omitempty"`
	Content   string        `json:"content,omitempty"`
	ToolCalls []apiToolCall `json:"tool_calls,omitempty"`
}

type textChoice struct {
	Index        int           `json:"index"`
	Text         string        `json:"text"`
	Logprobs     *textLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

// response is a completion or one streamed chunk of one.
type response struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices any    `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
	// Timings is llama-server's, in the chunks of a stream that asked for timings_per_token.
	Timings *timings `json:"timings,omitempty"`
}

// timings is llama-server's timings object: the prompt's tokens and the time to the first
// generated token, the tokens generated so far and the time since the first.
type timings struct {
	PromptN     int     `json:"prompt_n"`
	PromptMS    float64 `json:"prompt_ms"`
	PredictedN  int     `json:"predicted_n"`
	PredictedMS float64 `json:"predicted_ms"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelInfo `json:"data"`
}

type modelInfo struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// apiError is the body of every error answer: {"error": {...}} as OpenAI writes it.
type apiError struct {
	status  int
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) Error() string { return e.Message }

func badRequest(param, code, format string, args ...any) *apiError {
	return newError(400, "invalid_request_error", param, code, format, args...)
}

func newError(status int, typ, param, code, format string, args ...any) *apiError {
	e := &apiError{status: status, Type: typ, Message: fmt.Sprintf(format, args...)}
	if param != "" {
		e.Param = &param
	}
	if code != "" {
		e.Code = &code
	}
	return e
}

// finishReason is OpenAI's name for why generation ended.
func finishReason(s llm.StopReason) string {
	switch s {
	case llm.StopMaxTokens, llm.StopContext:
		return "length"
	}
	return "stop"
}
