package serve

import (
	"context"
	"errors"
	"net/http"

	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/prompt"
	"github.com/xpuhub/xpu/llm/tokenizer"
)

// The endpoints of other APIs (llama-server's, ollama's) share the OpenAI endpoints' runners,
// queue, limits and crash recovery through generateOne; only their shapes differ.

// generateOne runs one choice of j on a free runner. piece, when set, receives the text as it
// comes; a request cut by the timeout ends with the text so far and StopMaxTokens, as the
// OpenAI endpoints do.
func (s *Server) generateOne(ctx context.Context, r *http.Request, j *job, gen generateFunc, piece func(string) error) (llm.Result, *apiError) {
	sl, e := s.acquire(ctx, j.prompt)
	if e != nil {
		return llm.Result{}, e
	}
	defer func() {
		if sl != nil {
			s.slots.put(sl)
		}
	}()
	s.met.inflight.Add(1)
	defer s.met.inflight.Add(-1)
	sent := 0
	opts := append(j.genOptions(), llm.WithSampler(j.sampler))
	if piece != nil {
		opts = append(opts, llm.WithStream(func(text string) error { sent++; return piece(text) }))
	}
	var res llm.Result
	var err error
	sl, res, err = s.generate(ctx, sl, opts, gen, func() int { return sent })
	s.met.tokens(len(j.prompt), len(res.Tokens))
	switch {
	case err != nil && ctx.Err() != nil && r.Context().Err() == nil && !crashed(err):
		res.Stop = llm.StopMaxTokens
	case err != nil && ctx.Err() != nil && !crashed(err):
		return res, newError(http.StatusGatewayTimeout, "server_error", "", "timeout", "generation did not finish within the request timeout (%s)", s.cfg.timeout)
	case err != nil:
		return res, generationError(err)
	}
	return res, nil
}

// chatGen generates the assistant's answer to msgs (the template renders them).
func chatGen(msgs []prompt.Message) generateFunc {
	return func(ctx context.Context, sl *slot, opts []llm.GenerateOption) (llm.Result, error) {
		return sl.chat.Complete(ctx, msgs, opts...)
	}
}

// rawGen continues a raw prompt whose tokens are ids.
func rawGen(prompt string, ids []int32, stops []string) generateFunc {
	return func(ctx context.Context, sl *slot, opts []llm.GenerateOption) (llm.Result, error) {
		sl.chat.Reset() // the runner's cache no longer holds the chat's text
		return sl.r.GenerateUntil(ctx, prompt, stops, append(opts, llm.WithPromptTokens(ids))...)
	}
}

// encodeRaw encodes a raw prompt as /v1/completions does.
func (s *Server) encodeRaw(prompt string) []int32 {
	return s.tok.EncodeWith(prompt, tokenizer.AddSpecial(true), tokenizer.ParseSpecial(!s.cfg.noSpecial))
}

// renderChat renders msgs with the model's template, within ctx.
func (s *Server) renderChat(ctx context.Context, msgs []prompt.Message, param string) ([]int32, *apiError) {
	_, ids, err := s.tmpl.PromptContext(ctx, s.tok, msgs)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, newError(http.StatusGatewayTimeout, "server_error", "", "timeout",
			"the chat template did not render within the request timeout (%s)", s.cfg.timeout)
	case errors.Is(err, prompt.ErrLimit):
		return nil, badRequest(param, "chat_template_limit", "%v", err)
	case err != nil:
		return nil, badRequest(param, "invalid_value", "%v", err)
	}
	return ids, nil
}
