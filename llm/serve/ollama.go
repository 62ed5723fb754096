package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/xpuhub/xpu/llm/prompt"
)

// ollama's core API on the same port: POST /api/generate and /api/chat (streamed as
// newline-delimited JSON unless "stream": false, ollama's default being a stream),
// GET /api/tags, POST /api/show, GET /api/version. Errors are ollama's {"error": "..."}.

// OllamaVersion is what /api/version reports: the ollama API version whose shapes these
// endpoints follow (clients check it for features).
const OllamaVersion = "0.5.7"

func (s *Server) ollamaRoutes(mux *http.ServeMux) {
	mux.HandleFunc("/api/generate", s.ollamaPost(s.ollamaGenerate))
	mux.HandleFunc("/api/chat", s.ollamaPost(s.ollamaChat))
	mux.HandleFunc("/api/show", s.ollamaPost(s.ollamaShow))
	mux.HandleFunc("/api/tags", s.get(s.ollamaTags))
	mux.HandleFunc("/api/version", s.get(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": OllamaVersion})
	}))
}

// ollamaPost is post with ollama's error body.
func (s *Server) ollamaPost(h func(http.ResponseWriter, *http.Request) *apiError) http.HandlerFunc {
	return s.post(func(w http.ResponseWriter, r *http.Request) *apiError {
		if e := h(w, r); e != nil {
			writeJSON(w, e.status, map[string]string{"error": e.Message})
		}
		return nil
	})
}

// ollamaOptions are the model options of a request ("options"), in ollama's names.
type ollamaOptions struct {
	knobs
	NumPredict *int     `json:"num_predict"`
	Stop       []string `json:"stop"`
	NumKeep    *int     `json:"num_keep"` // n_keep in ollama's name
}

type ollamaCommon struct {
	Model   string          `json:"model"`
	Stream  *bool           `json:"stream"`
	Format  json.RawMessage `json:"format"`
	Options ollamaOptions   `json:"options"`
}

// job validates the request's model and options; ollama's names are the model's, with or
// without the ":latest" tag.
func (s *Server) ollamaJob(c *ollamaCommon, ids []int32) (*job, *apiError) {
	if name := strings.TrimSuffix(c.Model, ":latest"); name != s.cfg.name {
		return nil, newError(http.StatusNotFound, "", "model", "", "model %q not found; this server serves %q", c.Model, s.cfg.name)
	}
	if len(c.Format) > 0 && !isNull(c.Format) && string(c.Format) != `""` {
		return nil, badRequest("format", "", "format (structured output) is not supported")
	}
	sm := sampling{knobs: c.Options.knobs, Model: s.cfg.name, Stop: c.Options.Stop}
	if c.Options.NumKeep != nil {
		sm.NKeep = c.Options.NumKeep
	}
	if n := c.Options.NumPredict; n != nil && *n > 0 {
		sm.MaxTokens = n
	}
	// ollama's defaults are llama.cpp's, not OpenAI's: temperature 0.8, top_k 40, top_p 0.9
	if sm.Temperature == nil {
		sm.Temperature = ptr(0.8)
	}
	if sm.TopK == nil {
		sm.TopK = ptr(40)
	}
	if sm.TopP == nil {
		sm.TopP = ptr(0.9)
	}
	j, e := s.validate(&sm, ids, "prompt")
	if e != nil {
		return nil, e
	}
	if n := c.Options.NumPredict; n != nil && *n < 0 { // -1: until the context or the server's limit
		j.maxTokens = s.untilContext(len(ids))
	}
	j.stream = c.Stream == nil || *c.Stream
	return j, nil
}

func ptr[T any](v T) *T { return &v }

// ndjson writes newline-delimited JSON objects, flushing each.
type ndjson struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func newNDJSON(w http.ResponseWriter) *ndjson {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	return &ndjson{w: w, rc: http.NewResponseController(w)}
}

func (n *ndjson) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := n.w.Write(append(b, '\n')); err != nil {
		return err
	}
	return n.rc.Flush()
}

// ollamaRun generates and answers: each piece as one line of a stream (message wraps a
// piece in the endpoint's shape), then the final line with done, the reason and the counts.
func (s *Server) ollamaRun(w http.ResponseWriter, r *http.Request, j *job, gen generateFunc, message func(text string) map[string]any) *apiError {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.timeout)
	defer cancel()
	now := func() string { return time.Now().UTC().Format(time.RFC3339Nano) }
	var out *ndjson
	var piece func(string) error
	if j.stream {
		out = newNDJSON(w)
		piece = func(text string) error {
			m := message(text)
			m["model"], m["created_at"], m["done"] = s.cfg.name, now(), false
			return out.send(m)
		}
	}
	t0 := time.Now()
	res, e := s.generateOne(ctx, r, j, gen, piece)
	if e != nil {
		if out != nil {
			_ = out.send(map[string]string{"error": e.Message})
			return nil
		}
		return e
	}
	reason := "stop"
	if finishReason(res.Stop) == "length" {
		reason = "length"
	}
	text := res.Text
	if out != nil {
		text = ""
	}
	m := message(text)
	total := time.Since(t0)
	m["model"], m["created_at"], m["done"], m["done_reason"] = s.cfg.name, now(), true, reason
	m["total_duration"], m["load_duration"] = total.Nanoseconds(), 0
	m["prompt_eval_count"], m["prompt_eval_duration"] = len(j.prompt), res.Prefill.Nanoseconds()
	m["eval_count"], m["eval_duration"] = len(res.Tokens), (total - res.Prefill).Nanoseconds()
	if out != nil {
		_ = out.send(m)
		return nil
	}
	writeJSON(w, http.StatusOK, m)
	return nil
}

func (s *Server) ollamaGenerate(w http.ResponseWriter, r *http.Request) *apiError {
	var q struct {
		ollamaCommon
		Prompt string   `json:"prompt"`
		System string   `json:"system"`
		Raw    bool     `json:"raw"`
		Suffix string   `json:"suffix"`
		Images []string `json:"images"`
	}
	if e := decodeRequest(r, &q, nil); e != nil {
		return e
	}
	switch {
	case q.Suffix != "":
		return badRequest("suffix", "", "suffix (insertion) is not supported")
	case len(q.Images) > 0:
		return badRequest("images", "", "images are not supported: this is a text model")
	}
	var ids []int32
	var gen generateFunc
	if q.Raw {
		ids = s.encodeRaw(q.Prompt)
		gen = rawGen(q.Prompt, ids, q.Options.Stop)
	} else {
		var msgs []prompt.Message
		if q.System != "" {
			msgs = append(msgs, prompt.Message{Role: "system", Content: q.System})
		}
		msgs = append(msgs, prompt.Message{Role: "user", Content: q.Prompt})
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.timeout)
		var e *apiError
		ids, e = s.renderChat(ctx, msgs, "prompt")
		cancel()
		if e != nil {
			return e
		}
		gen = chatGen(msgs)
	}
	j, e := s.ollamaJob(&q.ollamaCommon, ids)
	if e != nil {
		return e
	}
	if q.Prompt == "" && !q.Raw { // ollama's "load the model": nothing to generate
		writeJSON(w, http.StatusOK, map[string]any{"model": s.cfg.name, "created_at": time.Now().UTC().Format(time.RFC3339Nano),
			"response": "", "done": true, "done_reason": "load"})
		return nil
	}
	return s.ollamaRun(w, r, j, gen, func(text string) map[string]any { return map[string]any{"response": text} })
}

func (s *Server) ollamaChat(w http.ResponseWriter, r *http.Request) *apiError {
	var q struct {
		ollamaCommon
		Messages []struct {
			Role    string   `json:"role"`
			Content string   `json:"content"`
			Images  []string `json:"images"`
		} `json:"messages"`
		Tools []any `json:"tools"`
	}
	if e := decodeRequest(r, &q, nil); e != nil {
		return e
	}
	if len(q.Tools) > 0 {
		return badRequest("tools", "", "tools are not supported")
	}
	if len(q.Messages) == 0 {
		return badRequest("messages", "", "messages must not be empty")
	}
	msgs := make([]prompt.Message, len(q.Messages))
	for i, m := range q.Messages {
		switch {
		case m.Role != "system" && m.Role != "user" && m.Role != "assistant":
			return badRequest("messages", "", "messages[%d].role %q: must be system, user or assistant", i, m.Role)
		case len(m.Images) > 0:
			return badRequest("messages", "", "messages[%d].images: images are not supported: this is a text model", i)
		}
		msgs[i] = prompt.Message{Role: m.Role, Content: m.Content}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.timeout)
	ids, e := s.renderChat(ctx, msgs, "messages")
	cancel()
	if e != nil {
		return e
	}
	j, e := s.ollamaJob(&q.ollamaCommon, ids)
	if e != nil {
		return e
	}
	return s.ollamaRun(w, r, j, chatGen(msgs), func(text string) map[string]any {
		return map[string]any{"message": map[string]string{"role": "assistant", "content": text}}
	})
}

// ollamaDetails describes the model as ollama's tags and show do.
func (s *Server) ollamaDetails() map[string]any {
	c := s.mdl.Config
	quant := ""
	if v, ok := s.mdl.File.Get("general.file_type"); ok {
		if n, ok := v.Int(); ok {
			quant = fmt.Sprintf("file type %d", n)
		}
	}
	return map[string]any{"format": "gguf", "family": c.Arch, "families": []string{c.Arch},
		"parameter_size": fmt.Sprintf("%d layers x %d", c.Layers, c.Dim), "quantization_level": quant}
}

func (s *Server) ollamaTags(w http.ResponseWriter, _ *http.Request) {
	size := s.mdl.WeightBytes()
	writeJSON(w, http.StatusOK, map[string]any{"models": []map[string]any{{
		"name": s.cfg.name + ":latest", "model": s.cfg.name + ":latest",
		"modified_at": time.Unix(s.created, 0).UTC().Format(time.RFC3339), "size": size,
		"digest": "", "details": s.ollamaDetails()}}})
}

func (s *Server) ollamaShow(w http.ResponseWriter, r *http.Request) *apiError {
	var q struct {
		Model string `json:"model"`
		Name  string `json:"name"` // the older field
	}
	if e := decodeRequest(r, &q, nil); e != nil {
		return e
	}
	name := q.Model
	if name == "" {
		name = q.Name
	}
	if strings.TrimSuffix(name, ":latest") != s.cfg.name {
		return newError(http.StatusNotFound, "", "model", "", "model %q not found; this server serves %q", name, s.cfg.name)
	}
	tmpl := ""
	if v, ok := s.mdl.File.Get("tokenizer.chat_template"); ok {
		tmpl, _ = v.Str()
	}
	c := s.mdl.Config
	info := map[string]any{"general.architecture": c.Arch,
		c.Arch + ".context_length": c.ContextLength, c.Arch + ".embedding_length": c.Dim,
		c.Arch + ".block_count": c.Layers, c.Arch + ".attention.head_count": c.Heads,
		c.Arch + ".attention.head_count_kv": c.KVHeads, "tokenizer.ggml.vocab_size": c.Vocab}
	writeJSON(w, http.StatusOK, map[string]any{"modelfile": "", "parameters": "", "template": tmpl,
		"details": s.ollamaDetails(), "model_info": info, "modified_at": time.Unix(s.created, 0).UTC().Format(time.RFC3339)})
	return nil
}
