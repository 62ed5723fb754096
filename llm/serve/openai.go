package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/grammar"
	"github.com/xpuhub/xpu/llm/prompt"
	"github.com/xpuhub/xpu/llm/sample"
	"github.com/xpuhub/xpu/llm/tokenizer"
)

// job is a validated request, ready to run on a runner.
type job struct {
	sampler   sample.Config
	maxTokens int
	stops     []string
	prompt    []int32 // the tokens the prompt encodes to (for the limits and usage)
	stream    bool
	usage     bool             // stream a usage chunk at the end
	grammar   *grammar.Grammar // response_format's, nil for text
	n         int              // choices, generated one after another
	logprobs  bool             // report each token's logprob
	echo      string           // text put before each completion's (the completions API's echo)
	tools     bool             // the model was given tools: its reply is parsed for calls
	keep      *int             // with a context shift, the request's n_keep (nil: no shift)
	timings   bool             // streamed chunks carry timings (llama-server's timings_per_token)
}

// genOptions are the generate options every choice of j shares but its sampler.
func (j *job) genOptions() []llm.GenerateOption {
	opts := []llm.GenerateOption{llm.WithMaxTokens(j.maxTokens)}
	if j.keep != nil {
		opts = append(opts, llm.WithContextShift(*j.keep))
	}
	return opts
}

// untilContext is the token budget of a request asking for tokens until the context ends
// (llama-server's n_predict -1): the room past its prompt, or with a context shift, which
// never runs out of room, the server's limit.
func (s *Server) untilContext(prompt int) int {
	if s.cfg.contextShift {
		return s.cfg.maxTokens
	}
	return min(s.cfg.maxTokens, s.ctxLen-prompt)
}

// validate checks what both endpoints share; prompt is the request's prompt tokens.
func (s *Server) validate(q *sampling, prompt []int32, promptParam string) (*job, *apiError) {
	if q.Model != s.cfg.name {
		return nil, newError(http.StatusNotFound, "invalid_request_error", "model", "model_not_found",
			"the model %q does not exist; this server serves %q", q.Model, s.cfg.name)
	}
	g, e := s.grammars.responseGrammar(q.ResponseFormat)
	if e != nil {
		return nil, e
	}
	j := &job{prompt: prompt, stream: q.Stream, stops: q.Stop, n: 1, grammar: g,
		usage: q.StreamOptions != nil && q.StreamOptions.IncludeUsage, timings: q.TimingsPerToken}
	if q.N != nil {
		if *q.N < 1 || *q.N > MaxChoices {
			return nil, badRequest("n", "invalid_value", "n = %d: must be 1 to %d", *q.N, MaxChoices)
		}
		j.n = *q.N
	}
	if len(j.stops) > 4 {
		return nil, badRequest("stop", "invalid_value", "at most 4 stop sequences, got %d", len(j.stops))
	}
	ctxLen := s.ctxLen
	room := ctxLen - len(prompt)
	if room < 1 {
		return nil, badRequest(promptParam, "context_length_exceeded",
			"the prompt is %d tokens; this model's context is %d", len(prompt), ctxLen)
	}
	max := q.MaxTokens
	if q.MaxCompletionTokens != nil {
		max = q.MaxCompletionTokens
	}
	if s.cfg.contextShift {
		// generation goes on past the context by shifting it: only the prompt must fit
		room = s.cfg.maxTokens
		keep := 0
		if q.NKeep != nil {
			if keep = *q.NKeep; keep < -1 {
				return nil, badRequest("n_keep", "invalid_value", "n_keep %d: must be -1 (the whole prompt), 0 or more", keep)
			}
		}
		j.keep = &keep
	}
	switch {
	case max == nil:
		j.maxTokens = min(defaultTokens, s.cfg.maxTokens, room)
	case *max < 1:
		return nil, badRequest("max_tokens", "invalid_value", "max_tokens %d: must be 1 or more", *max)
	case *max > s.cfg.maxTokens:
		return nil, badRequest("max_tokens", "invalid_value", "max_tokens %d exceeds this server's limit of %d", *max, s.cfg.maxTokens)
	case *max > room:
		return nil, badRequest("max_tokens", "context_length_exceeded",
			"the prompt (%d tokens) plus max_tokens (%d) exceed this model's context of %d", len(prompt), *max, ctxLen)
	default:
		j.maxTokens = *max
	}
	if j.sampler, e = q.knobs.sampler(s.tok.Size(), ctxLen); e != nil {
		return nil, e
	}
	return j, nil
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	var s uint64
	for _, x := range b {
		s = s<<8 | uint64(x)
	}
	return s | 1 // the sampler reads seed 0 as "none"
}

func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

var validRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// decodeRequest reads a body into q, refusing the known parameters the server cannot honour.
func decodeRequest(r *http.Request, q any, rules []unsupported) *apiError {
	var raw json.RawMessage
	if e := decode(r, &raw); e != nil {
		return e
	}
	if err := json.Unmarshal(raw, q); err != nil {
		return badRequest("", "invalid_json", "invalid JSON body: %v", err)
	}
	return refuse(raw, rules)
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) *apiError {
	var q chatRequest
	if e := decodeRequest(r, &q, chatRefusals); e != nil {
		return e
	}
	if len(q.Messages) == 0 {
		return badRequest("messages", "invalid_value", "messages must not be empty")
	}
	msgs := make([]prompt.Message, len(q.Messages))
	for i, m := range q.Messages {
		if !validRoles[m.Role] {
			return badRequest(fmt.Sprintf("messages[%d].role", i), "invalid_value",
				"role %q: must be system, developer, user, assistant or tool", m.Role)
		}
		role := m.Role
		if role == "developer" { // OpenAI's newer name for the system role
			role = "system"
		}
		msgs[i] = prompt.Message{Role: role, Content: string(m.Content), ToolCallID: m.ToolCallID}
		for _, c := range m.ToolCalls {
			msgs[i].ToolCalls = append(msgs[i].ToolCalls, prompt.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
		}
	}
	tools, required, e := checkTools(q.Tools, q.ToolChoice)
	if e != nil {
		return e
	}
	// the request's time starts before rendering: a slow template is part of it
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.timeout)
	defer cancel()
	_, ids, err := s.tmpl.PromptToolsContext(ctx, s.tok, msgs, tools)
	switch {
	case err != nil && ctx.Err() != nil:
		return newError(http.StatusGatewayTimeout, "server_error", "", "timeout",
			"the chat template did not render within the request timeout (%s)", s.cfg.timeout)
	case errors.Is(err, prompt.ErrLimit):
		return badRequest("messages", "chat_template_limit", "%v", err)
	case err != nil:
		return badRequest("messages", "invalid_value", "%v", err)
	}
	j, e := s.validate(&q.sampling, ids, "messages")
	if e != nil {
		return e
	}
	j.logprobs = q.Logprobs != nil && *q.Logprobs
	j.tools = tools != nil
	if required != nil {
		if j.grammar != nil {
			return badRequest("tool_choice", "invalid_value", "tool_choice requires a call and response_format a format: give one of them")
		}
		if j.grammar, e = s.callGrammar(ctx, required); e != nil {
			return e
		}
	}
	if q.TopLogprobs != nil {
		switch {
		case *q.TopLogprobs < 0 || *q.TopLogprobs > sample.MaxTopLogprobs:
			return badRequest("top_logprobs", "invalid_value", "top_logprobs %d: must be 0 to %d", *q.TopLogprobs, sample.MaxTopLogprobs)
		case !j.logprobs:
			return badRequest("top_logprobs", "invalid_value", "top_logprobs needs logprobs: true")
		}
		j.sampler.TopLogprobs = *q.TopLogprobs
	}
	return s.run(ctx, w, r, j, "chat.completion", func(ctx context.Context, sl *slot, opts []llm.GenerateOption) (llm.Result, error) {
		return sl.chat.CompleteTools(ctx, msgs, tools, opts...)
	})
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request) *apiError {
	var q completionRequest
	if e := decodeRequest(r, &q, completionRefusals); e != nil {
		return e
	}
	if len(q.Prompt) != 1 {
		return badRequest("prompt", "invalid_value", "prompt must be one string (got %d)", len(q.Prompt))
	}
	prompt := q.Prompt[0]
	ids := s.tok.EncodeWith(prompt, tokenizer.AddSpecial(true), tokenizer.ParseSpecial(!s.cfg.noSpecial))
	if len(ids) == 0 {
		return badRequest("prompt", "invalid_value", "empty prompt and the vocabulary adds no BOS token")
	}
	j, e := s.validate(&q.sampling, ids, "prompt")
	if e != nil {
		return e
	}
	if q.Logprobs != nil {
		if *q.Logprobs < 0 || *q.Logprobs > 5 {
			return badRequest("logprobs", "invalid_value", "logprobs %d: must be 0 to 5", *q.Logprobs)
		}
		j.logprobs, j.sampler.TopLogprobs = true, *q.Logprobs
	}
	if q.BestOf != nil && *q.BestOf != j.n {
		return badRequest("best_of", "unsupported_value", "best_of %d: only best_of = n (%d) is supported: the server does not rank candidates", *q.BestOf, j.n)
	}
	if q.Echo {
		j.echo = prompt
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.timeout)
	defer cancel()
	return s.run(ctx, w, r, j, "text_completion", func(ctx context.Context, sl *slot, opts []llm.GenerateOption) (llm.Result, error) {
		return sl.r.GenerateUntil(ctx, prompt, j.stops, append(opts, llm.WithPromptTokens(ids), llm.WithPromptCache())...)
	})
}
