package serve

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/sample"
	"github.com/xpuhub/xpu/llm/tokenizer"
)

// llama-server's own endpoints, in its shapes: POST /completion (streamed as server-sent
// events without a [DONE]), /tokenize, /detokenize; GET /props, /slots. And OpenAI's
// GET /v1/models/{id}.

// routes adds the endpoints beyond OpenAI's chat and completions to mux.
func (s *Server) routes(mux *http.ServeMux) {
	mux.HandleFunc("/v1/models/", s.get(s.model))
	mux.HandleFunc("/completion", s.post(s.llamaCompletion))
	mux.HandleFunc("/tokenize", s.post(s.tokenize))
	mux.HandleFunc("/detokenize", s.post(s.detokenize))
	mux.HandleFunc("/props", s.get(s.props))
	mux.HandleFunc("/slots", s.get(s.slotsInfo))
	s.ollamaRoutes(mux)
}

func (s *Server) model(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/v1/models/")
	if id != s.cfg.name {
		writeError(w, newError(http.StatusNotFound, "invalid_request_error", "model", "model_not_found",
			"the model %q does not exist; this server serves %q", id, s.cfg.name))
		return
	}
	writeJSON(w, http.StatusOK, modelInfo{ID: s.cfg.name, Object: "model", Created: s.created, OwnedBy: "xpu"})
}

// promptArg is llama-server's prompt: a string, or an array of token ids.
type promptArg struct {
	text string
	ids  []int32
}

func (p *promptArg) UnmarshalJSON(b []byte) error {
	if err := json.Unmarshal(b, &p.text); err == nil {
		return nil
	}
	if err := json.Unmarshal(b, &p.ids); err != nil {
		return errString("must be a string or an array of token ids")
	}
	return nil
}

type errString string

func (e errString) Error() string { return string(e) }

// checkIDs refuses token ids outside the vocabulary.
func (s *Server) checkIDs(param string, ids []int32) *apiError {
	for i, id := range ids {
		if id < 0 || int(id) >= s.tok.Size() {
			return badRequest(param, "invalid_value", "%s[%d] = %d: not a token id (0 to %d)", param, i, id, s.tok.Size()-1)
		}
	}
	return nil
}

type llamaCompletionRequest struct {
	knobs
	Prompt   *promptArg   `json:"prompt"`
	NPredict *int         `json:"n_predict"`
	Stop     stringOrList `json:"stop"`
	Stream   bool         `json:"stream"`
	NProbs   int          `json:"n_probs"`
}

// llamaProb is one entry of llama-server's completion_probabilities.
type llamaProb struct {
	ID          int32       `json:"id"`
	Token       string      `json:"token"`
	Logprob     float64     `json:"logprob"`
	Bytes       []int       `json:"bytes"`
	TopLogprobs []llamaProb `json:"top_logprobs,omitempty"`
}

func (s *Server) llamaCompletion(w http.ResponseWriter, r *http.Request) *apiError {
	var q llamaCompletionRequest
	if e := decodeRequest(r, &q, nil); e != nil {
		return e
	}
	if q.Prompt == nil {
		return badRequest("prompt", "invalid_value", "prompt is required")
	}
	prompt, ids := q.Prompt.text, q.Prompt.ids
	if ids == nil {
		ids = s.encodeRaw(prompt)
	} else {
		if e := s.checkIDs("prompt", ids); e != nil {
			return e
		}
		prompt = s.tok.Decode(ids)
	}
	if len(ids) == 0 {
		return badRequest("prompt", "invalid_value", "empty prompt and the vocabulary adds no BOS token")
	}
	sm := sampling{knobs: q.knobs, Model: s.cfg.name, Stop: q.Stop}
	if q.NPredict != nil && *q.NPredict >= 0 {
		sm.MaxTokens = q.NPredict
	}
	j, e := s.validate(&sm, ids, "prompt")
	if e != nil {
		return e
	}
	if q.NPredict == nil || *q.NPredict < 0 { // llama-server's -1: until the context or the server's limit
		j.maxTokens = s.untilContext(len(ids))
	}
	if q.NProbs < 0 || q.NProbs > sample.MaxTopLogprobs {
		return badRequest("n_probs", "invalid_value", "n_probs %d: must be 0 to %d", q.NProbs, sample.MaxTopLogprobs)
	}
	var lps []sample.TokenLogprob
	if q.NProbs > 0 {
		j.sampler.TopLogprobs = q.NProbs
		j.sampler.Logprobs = func(l sample.TokenLogprob) { lps = append(lps, l) }
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.timeout)
	defer cancel()
	var sse *sseWriter
	var piece func(string) error
	sentLps := 0
	if q.Stream {
		sse = newSSE(w)
		piece = func(text string) error {
			m := map[string]any{"content": text, "stop": false, "index": 0}
			if q.NProbs > 0 {
				m["completion_probabilities"] = s.llamaProbs(lps[sentLps:])
				sentLps = len(lps)
			}
			return sse.send(m)
		}
	}
	t0 := time.Now()
	res, e := s.generateOne(ctx, r, j, rawGen(prompt, ids, j.stops), piece)
	if e != nil {
		if sse != nil {
			_ = sse.send(map[string]*apiError{"error": e})
			return nil
		}
		return e
	}
	stopType := map[llm.StopReason]string{llm.StopEOS: "eos", llm.StopString: "word"}[res.Stop]
	if stopType == "" {
		stopType = "limit"
	}
	final := map[string]any{"content": res.Text, "stop": true, "index": 0, "id_slot": -1, "model": s.cfg.name,
		"tokens_predicted": len(res.Tokens), "tokens_evaluated": len(ids), "stop_type": stopType,
		"truncated": false, "tokens": res.Tokens, "prompt": prompt,
		"timings": map[string]any{"prompt_n": len(ids), "prompt_ms": ms(res.Prefill),
			"predicted_n": len(res.Tokens), "predicted_ms": ms(time.Since(t0) - res.Prefill),
			"predicted_per_second": res.DecodeTokensPerSecond()}}
	if q.NProbs > 0 {
		final["completion_probabilities"] = s.llamaProbs(lps[sentLps:])
	}
	if sse != nil {
		final["content"] = ""
		_ = sse.send(final)
		return nil
	}
	writeJSON(w, http.StatusOK, final)
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (s *Server) llamaProbs(lps []sample.TokenLogprob) []llamaProb {
	entry := func(id int32, lp float64) llamaProb {
		t := s.tok.Piece(id)
		return llamaProb{ID: id, Token: t, Logprob: lp, Bytes: textBytes(t)}
	}
	out := make([]llamaProb, 0, len(lps))
	for _, l := range lps {
		e := entry(l.ID, l.Logprob)
		for _, t := range l.Top {
			e.TopLogprobs = append(e.TopLogprobs, entry(t.ID, t.Logprob))
		}
		out = append(out, e)
	}
	return out
}

// textBytes is t's UTF-8 bytes as a JSON array of numbers (a []byte would be base64).
func textBytes(t string) []int {
	b := make([]int, len(t))
	for i := range len(t) {
		b[i] = int(t[i])
	}
	return b
}

func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) *apiError {
	var q struct {
		Content    *string `json:"content"`
		AddSpecial bool    `json:"add_special"`
		WithPieces bool    `json:"with_pieces"`
	}
	if e := decodeRequest(r, &q, nil); e != nil {
		return e
	}
	if q.Content == nil {
		return badRequest("content", "invalid_value", "content is required")
	}
	ids := s.tok.EncodeWith(*q.Content, tokenizer.AddSpecial(q.AddSpecial), tokenizer.ParseSpecial(!s.cfg.noSpecial))
	if !q.WithPieces {
		writeJSON(w, http.StatusOK, map[string]any{"tokens": ids})
		return nil
	}
	type piece struct {
		ID    int32  `json:"id"`
		Piece string `json:"piece"`
	}
	ps := make([]piece, len(ids))
	for i, id := range ids {
		ps[i] = piece{id, s.tok.Piece(id)}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": ps})
	return nil
}

func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) *apiError {
	var q struct {
		Tokens []int32 `json:"tokens"`
	}
	if e := decodeRequest(r, &q, nil); e != nil {
		return e
	}
	if e := s.checkIDs("tokens", q.Tokens); e != nil {
		return e
	}
	writeJSON(w, http.StatusOK, map[string]any{"content": s.tok.Decode(q.Tokens)})
	return nil
}

// props is llama-server's GET /props: the defaults a request starts from, the slots and the
// chat template.
func (s *Server) props(w http.ResponseWriter, _ *http.Request) {
	tmpl := ""
	if v, ok := s.mdl.File.Get("tokenizer.chat_template"); ok {
		tmpl, _ = v.Str()
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"default_generation_settings": map[string]any{"n_ctx": s.ctxLen, "model": s.cfg.name,
			"params": map[string]any{"temperature": 1, "top_p": 1, "top_k": 0, "min_p": 0, "typical_p": 1,
				"repeat_penalty": 1, "repeat_last_n": 64, "presence_penalty": 0, "frequency_penalty": 0,
				"n_predict": defaultTokens}},
		"total_slots":   s.cfg.parallel,
		"model_alias":   s.cfg.name,
		"chat_template": tmpl,
		"modalities":    map[string]bool{"vision": false, "audio": false},
		"build_info":    "xpu",
	})
}

// slotsInfo is llama-server's GET /slots. The pool hands runners out in no fixed order, so
// the busy ones are reported as the first ids: the count is exact, the ids are not.
func (s *Server) slotsInfo(w http.ResponseWriter, _ *http.Request) {
	busy := s.cfg.parallel - s.slots.idle()
	out := make([]map[string]any, s.cfg.parallel)
	for i := range out {
		out[i] = map[string]any{"id": i, "n_ctx": s.ctxLen, "is_processing": i < busy}
	}
	writeJSON(w, http.StatusOK, out)
}
