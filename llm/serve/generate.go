package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/grammar"
	"github.com/xpuhub/xpu/llm/sample"
)

// acquire waits for a free runner, in the bounded queue, and rebuilds it first when the backend
// crashed since it last ran.
func (s *Server) acquire(ctx context.Context, prompt []int32) (*slot, *apiError) {
	if _, err := s.modelChanged(); err != nil {
		fix := "restart the server to serve the new one"
		if s.cfg.reload != nil {
			fix = "the server is loading the new one; retry shortly"
		}
		return nil, newError(http.StatusServiceUnavailable, "server_error", "", "model_changed",
			"the model file changed on disk since it was loaded; %s: %v", fix, err)
	}
	sl, e := s.wait(ctx, prompt)
	if e != nil {
		return nil, e
	}
	if s.stale(sl) {
		if err := s.rebuild(ctx, sl); err != nil {
			s.recoverInBackground(sl)
			return nil, newError(http.StatusServiceUnavailable, "server_error", "", "backend_restarting",
				"the backend crashed and is being restarted: %v", err)
		}
	}
	return sl, nil
}

// wait takes the free runner whose cache suits prompt best (pool.take), or waits for one in
// the bounded queue.
func (s *Server) wait(ctx context.Context, prompt []int32) (*slot, *apiError) {
	sl, full := s.slots.get(ctx, prompt, s.cfg.maxQueue)
	switch {
	case full:
		return nil, newError(http.StatusTooManyRequests, "rate_limit_error", "", "queue_full",
			"%d requests are already waiting for the model; try again later", s.cfg.maxQueue)
	case sl == nil:
		return nil, newError(http.StatusServiceUnavailable, "server_error", "", "timeout",
			"no runner became free within the request timeout (%s)", s.cfg.timeout)
	}
	return sl, nil
}

type generateFunc func(ctx context.Context, sl *slot, opts []llm.GenerateOption) (llm.Result, error)

// generate runs gen on sl. When the backend crashes before the client got a token (sent says
// how many it got), the runner is rebuilt and the request runs once more; otherwise the slot
// goes to a background rebuild and generate returns nil for it, so that the caller does not
// give it back to the pool.
func (s *Server) generate(ctx context.Context, sl *slot, opts []llm.GenerateOption, gen generateFunc, sent func() int) (*slot, llm.Result, error) {
	for attempt := 0; ; attempt++ {
		if s.hooks.beforeGenerate != nil {
			s.hooks.beforeGenerate(attempt)
		}
		res, err := gen(ctx, sl, opts)
		if !crashed(err) {
			return sl, res, err
		}
		s.noteCrash(sl, err)
		if attempt > 0 || sent() > 0 || ctx.Err() != nil {
			s.recoverInBackground(sl)
			return nil, res, err
		}
		if rerr := s.rebuild(ctx, sl); rerr != nil {
			s.recoverInBackground(sl)
			return nil, res, fmt.Errorf("%w; rebuilding the runner: %w", err, rerr)
		}
		s.cfg.logger.Debug("serve: retrying the request after a backend crash")
	}
}

// run generates on a free runner and writes the answer, whole or as a stream; ctx is r's
// context bounded by the request timeout. Choice i runs with the request's seed plus i. With
// n > 1 the choices run at once on the runners free when the request starts (batch.go: their
// decodes share steps), each runner taking every len(runners)-th choice; with none free beside
// its own, one after another on it.
func (s *Server) run(ctx context.Context, w http.ResponseWriter, r *http.Request, j *job, object string, gen generateFunc) *apiError {
	sl, e := s.acquire(ctx, j.prompt)
	if e != nil {
		return e
	}
	held := s.choiceSlots(sl, j)
	defer func() {
		for _, sl := range held {
			if sl != nil {
				s.slots.put(sl)
			}
		}
	}()
	s.met.inflight.Add(1)
	defer s.met.inflight.Add(-1)

	chat := object == "chat.completion"
	id, created := newID("cmpl-"), time.Now().Unix()
	if chat {
		id = newID("chatcmpl-")
	}
	// choice prepares the options of choice i; lps collects its tokens' logprobs
	choice := func(i int, lps *[]sample.TokenLogprob) []llm.GenerateOption {
		sc := j.sampler
		sc.Seed += uint64(i)
		if j.logprobs {
			sc.Logprobs = func(l sample.TokenLogprob) { *lps = append(*lps, l) }
		}
		opts := append(j.genOptions(), llm.WithSampler(sc))
		if j.grammar != nil {
			opts = append(opts, llm.WithConstraint(grammar.NewTokenMatcher(j.grammar, s.tok)))
		}
		return opts
	}
	var mu sync.Mutex // completion, cached and the stream's writes, shared by the choices
	completion := 0   // tokens generated over all choices
	cached := -1      // the first choice's cached prompt tokens
	count := func(i int, res llm.Result) {
		s.met.tokens(len(j.prompt), len(res.Tokens))
		mu.Lock()
		completion += len(res.Tokens)
		if i == 0 {
			cached = res.CachedTokens
		}
		mu.Unlock()
	}
	if j.stream {
		sse := newSSE(w)
		send := func(v any) error {
			mu.Lock()
			defer mu.Unlock()
			return sse.send(v)
		}
		chunkObject := "chat.completion.chunk"
		if !chat {
			chunkObject = object
		}
		// offset: the text_offset of the choice's next token (completions' logprobs)
		piece := func(i int, text string, lps []sample.TokenLogprob, finish *string, offset *int) response {
			resp := response{ID: id, Object: chunkObject, Created: created, Model: s.cfg.name}
			if chat {
				resp.Choices = []chatChoice{{Index: i, Delta: &delta{Content: text}, FinishReason: finish,
					Logprobs: s.chatLogprobs(j, lps)}}
			} else {
				resp.Choices = []textChoice{{Index: i, Text: text, FinishReason: finish, Logprobs: s.textLogprobs(j, lps, offset)}}
			}
			return resp
		}
		// a choice that fails ends the stream without [DONE] (after an error event, or with the
		// client gone): the others stop
		failed := false
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		fail := func() bool {
			mu.Lock()
			failed = true
			mu.Unlock()
			cancel()
			return false
		}
		s.eachChoice(held, j.n, func(k, i int) bool {
			offset := len(j.echo)
			tm := newTokenTimer(j)
			if chat {
				first := response{ID: id, Object: chunkObject, Created: created, Model: s.cfg.name,
					Choices: []chatChoice{{Index: i, Delta: &delta{Role: "assistant"}}}, Timings: tm.now()}
				if err := send(first); err != nil {
					return fail() // the client is gone
				}
			} else if j.echo != "" {
				offset = 0
				p := piece(i, j.echo, nil, nil, &offset)
				p.Timings = tm.now()
				if err := send(p); err != nil {
					return fail()
				}
			}
			var lps []sample.TokenLogprob
			sentLps := 0
			sent := 0
			// with tools, the reply's beginning is held back while it may be a tool call
			var heldText strings.Builder
			holding := j.tools
			stream := func(text string) error {
				if s.hooks.beforeSend != nil {
					s.hooks.beforeSend(sent)
				}
				sent++
				if holding {
					heldText.WriteString(text)
					if mayBeToolCall(heldText.String()) {
						return nil
					}
					holding, text = false, heldText.String()
				}
				// the tokens sampled since the last piece travel with it
				p := piece(i, text, lps[sentLps:], nil, &offset)
				sentLps = len(lps)
				p.Timings = tm.now()
				return send(p)
			}
			opts := append(choice(i, &lps), llm.WithStream(stream))
			if tm != nil {
				opts = append(opts, llm.WithTokenCallback(tm.token))
			}
			var res llm.Result
			var err error
			held[k], res, err = s.generate(sctx, held[k], opts, s.replyOr(gen, stream), func() int { return sent })
			count(i, res)
			switch {
			case err != nil && r.Context().Err() != nil:
				s.cfg.logger.Debug("serve: client went away during a stream", "err", err)
				return fail()
			case err != nil && sctx.Err() != nil && ctx.Err() == nil && !crashed(err):
				return false // another choice failed
			case err != nil && ctx.Err() != nil && !crashed(err):
				// the request timeout cut generation: the stream still ends well-formed
				res.Stop = llm.StopMaxTokens
			case err != nil:
				s.cfg.logger.Warn("serve: generation failed", "err", err)
				_ = send(map[string]*apiError{"error": generationError(err)})
				return fail()
			}
			fin := finishReason(res.Stop)
			if holding && heldText.Len() > 0 {
				if calls, ok := parseToolCalls(heldText.String()); ok {
					fin = "tool_calls"
					_ = send(response{ID: id, Object: chunkObject, Created: created, Model: s.cfg.name,
						Choices: []chatChoice{{Index: i, Delta: &delta{ToolCalls: apiToolCalls(calls, true)}}}})
				} else {
					p := piece(i, heldText.String(), lps[sentLps:], nil, &offset)
					p.Timings = tm.now()
					_ = send(p)
					sentLps = len(lps)
				}
			}
			last := piece(i, "", lps[min(sentLps, len(lps)):], &fin, &offset)
			last.Timings = tm.now()
			_ = send(last)
			return ctx.Err() == nil // the time is up: no further choice
		})
		if failed {
			return nil
		}
		if j.usage {
			u := usageOf(j, completion, cached)
			_ = sse.send(response{ID: id, Object: chunkObject, Created: created, Model: s.cfg.name,
				Choices: []chatChoice{}, Usage: &u})
		}
		_ = sse.done()
		return nil
	}
	type outcome struct {
		ran bool
		res llm.Result
		err error
		lps []sample.TokenLogprob
	}
	outs := make([]outcome, j.n)
	s.eachChoice(held, j.n, func(k, i int) bool {
		var lps []sample.TokenLogprob
		opts := choice(i, &lps)
		if s.hooks.beforeSend != nil {
			n := 0
			opts = append(opts, llm.WithStream(func(string) error { s.hooks.beforeSend(n); n++; return nil }))
		}
		var res llm.Result
		var err error
		held[k], res, err = s.generate(ctx, held[k], opts, s.replyOr(gen, nil), func() int { return 0 })
		count(i, res)
		outs[i] = outcome{ran: true, res: res, err: err, lps: lps}
		return err == nil && ctx.Err() == nil
	})
	var chatChoices []chatChoice
	var textChoices []textChoice
	for i, o := range outs {
		if !o.ran {
			break // the time ran out (or a choice before failed) before this one started
		}
		res, err := o.res, o.err
		switch {
		case err != nil && ctx.Err() != nil && r.Context().Err() == nil && !crashed(err):
			// the request timeout cut generation: answer with the text so far, as a stream does
			res.Stop = llm.StopMaxTokens
		case err != nil && ctx.Err() != nil && !crashed(err):
			return newError(http.StatusGatewayTimeout, "server_error", "", "timeout",
				"generation did not finish within the request timeout (%s)", s.cfg.timeout)
		case err != nil:
			return generationError(err)
		}
		fin := finishReason(res.Stop)
		if chat {
			msg := &replyMessage{Role: "assistant", Content: &res.Text}
			if calls, ok := parseToolCalls(res.Text); ok && j.tools {
				msg.Content, msg.ToolCalls, fin = nil, apiToolCalls(calls, false), "tool_calls"
			}
			chatChoices = append(chatChoices, chatChoice{Index: i, Message: msg, FinishReason: &fin, Logprobs: s.chatLogprobs(j, o.lps)})
		} else {
			offset := len(j.echo)
			textChoices = append(textChoices, textChoice{Index: i, Text: j.echo + res.Text, FinishReason: &fin,
				Logprobs: s.textLogprobs(j, o.lps, &offset)})
		}
	}
	u := usageOf(j, completion, cached)
	resp := response{ID: id, Object: object, Created: created, Model: s.cfg.name, Usage: &u}
	if chat {
		resp.Choices = chatChoices
	} else {
		resp.Choices = textChoices
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// chatLogprobs is the chat API's logprobs of tokens (nil when the request asked for none).
func (s *Server) chatLogprobs(j *job, lps []sample.TokenLogprob) *chatLogprobs {
	if !j.logprobs {
		return nil
	}
	entry := func(id int32, lp float64) tokenLogprob {
		t := s.tok.Piece(id)
		b := make([]int, len(t))
		for i := range len(t) {
			b[i] = int(t[i])
		}
		return tokenLogprob{Token: t, Logprob: lp, Bytes: b}
	}
	out := &chatLogprobs{Content: make([]tokenLogprob, 0, len(lps))}
	for _, l := range lps {
		e := entry(l.ID, l.Logprob)
		e.TopLogprobs = []tokenLogprob{}
		for _, t := range l.Top {
			e.TopLogprobs = append(e.TopLogprobs, entry(t.ID, t.Logprob))
		}
		out.Content = append(out.Content, e)
	}
	return out
}

// textLogprobs is the completions API's logprobs of tokens; *offset is the first token's
// offset in the choice's text and moves past them.
func (s *Server) textLogprobs(j *job, lps []sample.TokenLogprob, offset *int) *textLogprobs {
	if !j.logprobs {
		return nil
	}
	out := &textLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
	for _, l := range lps {
		t := s.tok.Piece(l.ID)
		out.Tokens = append(out.Tokens, t)
		out.TokenLogprobs = append(out.TokenLogprobs, l.Logprob)
		top := map[string]float64{}
		for _, c := range l.Top {
			if _, dup := top[s.tok.Piece(c.ID)]; !dup { // two ids may share a text: the likelier wins
				top[s.tok.Piece(c.ID)] = c.Logprob
			}
		}
		out.TopLogprobs = append(out.TopLogprobs, top)
		out.TextOffset = append(out.TextOffset, *offset)
		*offset += len(t)
	}
	return out
}

// generationError is the answer to a failed generation: 503 when the backend crashed (the
// server is rebuilding; a retry will do), 500 otherwise.
func generationError(err error) *apiError {
	if crashed(err) {
		return newError(http.StatusServiceUnavailable, "server_error", "", "backend_crashed",
			"the backend crashed during generation and is being restarted; retry the request: %v", err)
	}
	return newError(http.StatusInternalServerError, "server_error", "", "generation_failed", "%v", err)
}

// usageOf counts the prompt once, as OpenAI does for n > 1, and the tokens of every choice;
// cached is how many prompt tokens the runner's cache held.
func usageOf(j *job, completion, cached int) usage {
	return usage{PromptTokens: len(j.prompt), CompletionTokens: completion,
		TotalTokens: len(j.prompt) + completion, PromptDetails: promptDetails{CachedTokens: max(cached, 0)}}
}

// sseWriter writes server-sent events, flushing each.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func newSSE(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

func (s *sseWriter) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(s.w, "data: %s\n\n", b); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sseWriter) done() error {
	if _, err := io.WriteString(s.w, "data: [DONE]\n\n"); err != nil {
		return err
	}
	return s.rc.Flush()
}

// tokenTimer counts a streamed choice's tokens for llama-server's timings_per_token: a chunk's
// predicted_n tells a client how many tokens its text carries (a token that ends inside a
// character streams no text of its own). A nil timer (the request asked for none) reports nil.
type tokenTimer struct {
	start, first time.Time
	prompt, n    int
}

func newTokenTimer(j *job) *tokenTimer {
	if !j.timings {
		return nil
	}
	return &tokenTimer{start: time.Now(), prompt: len(j.prompt)}
}

// token counts a generated token; it is a WithTokenCallback.
func (t *tokenTimer) token(int32) error {
	if t.n == 0 {
		t.first = time.Now()
	}
	t.n++
	return nil
}

// now is the timings of the tokens counted so far (nil for a nil timer).
func (t *tokenTimer) now() *timings {
	if t == nil {
		return nil
	}
	tm := &timings{PromptN: t.prompt, PredictedN: t.n}
	if t.n > 0 {
		tm.PromptMS, tm.PredictedMS = ms(t.first.Sub(t.start)), ms(time.Since(t.first))
	}
	return tm
}
