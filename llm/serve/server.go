// Package serve is an OpenAI-compatible HTTP server for a model loaded with llm.Load:
// POST /v1/chat/completions and /v1/completions (streamed as server-sent events with
// "stream": true), GET /v1/models and /v1/models/{id}, /health and /metrics (Prometheus text
// format). The same port speaks llama-server's /completion, /tokenize, /detokenize, /props and
// /slots (llamaserver.go) and ollama's /api/generate, /api/chat, /api/tags, /api/show and
// /api/version (ollama.go). Every OpenAI parameter is honoured or refused by name (params.go);
// tools are rendered through the chat template and calls parsed back (toolcalls.go).
//
// A runner holds one sequence at a time, so requests share the model through a pool of
// runners (WithParallel, default 1: the engine's own). A request waits in a bounded queue
// (WithMaxQueue, first come first served) for a free runner and is refused with 429 when the
// queue is full. With several, the runners are one llm.Batch (batch.go): one copy of the
// weights, a KV cache each, and the decodes of the requests generating at once run as one step
// (continuous batching: a request joins and leaves between tokens). A
// runner keeps its KV cache between requests: a request goes to the free runner whose cache
// holds the longest prefix of its prompt (pool.go says when a match counts), which keeps that
// prefix and prefills only the rest; usage.prompt_tokens_details.cached_tokens says how many
// prompt tokens were reused.
//
// Limits: the request body (WithMaxBodyBytes, 413 past it; one JSON value, 400 for anything
// after it), max_tokens (WithMaxTokens, 400 past it), the prompt plus max_tokens within the
// context (400; with WithContextShift only the prompt, generation shifting the context as
// llama-server does, n_keep per request), and the time a request may take from arrival to its last token
// (WithRequestTimeout; a request still queued then gets 503, generation in progress is cut and
// the answer, whole or streamed, ends with finish_reason "length" and the text made so far).
// Errors are OpenAI-style bodies: {"error": {"message", "type", "param", "code"}}.
//
// Connections: HTTPServer and Listener apply the header, read (headers and body), idle and
// per-write timeouts and the connection limits, total and per client address, so that slow or
// idle clients are closed and cannot exhaust the process's file descriptors (see conn.go's
// defaults).
//
// Chat messages are rendered with the model's template and never have control-token texts
// parsed (llm.ChatTemplate.Prompt); a raw /v1/completions prompt has them parsed, as
// llama.cpp's server does, unless WithoutSpecialTokens.
//
// A crashed isolated backend (its plugin host died) is restarted, with backoff while that
// fails, and each runner is rebuilt before it runs again; a request the crash interrupted
// before any token reached the client runs once more, a stream already under way ends with an
// error event. /health answers 503 while the backend is down and reports the restarts.
//
// Shutdown is http.Server.Shutdown's: the listener closes, and requests in flight, streams
// included, run to their end.
package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/grammar"
	"github.com/xpuhub/xpu/llm/tokenizer"
)

// Defaults of the options.
const (
	DefaultMaxTokens      = 2048
	DefaultMaxBodyBytes   = 1 << 20
	DefaultRequestTimeout = 5 * time.Minute
	DefaultMaxQueue       = 64
	// DefaultRestartBackoff is the first wait between failed rebuilds after a backend crash.
	DefaultRestartBackoff = 100 * time.Millisecond
	// MaxRestartBackoff bounds the wait between failed rebuilds.
	MaxRestartBackoff = 10 * time.Second
	// defaultTokens is max_tokens when a request gives none (at most the server's limit and
	// what the context has room for).
	defaultTokens = 256
)

type config struct {
	name       string
	parallel   int
	noBatch    bool // WithoutBatching
	maxTokens  int
	maxBody    int64
	timeout    time.Duration
	maxQueue   int
	logger     *slog.Logger
	chatOption []llm.ChatOption
	// restartBackoff is the first wait between failed rebuilds after a backend crash
	restartBackoff time.Duration
	noSpecial      bool // /v1/completions encodes control-token texts as plain text
	contextShift   bool // WithContextShift
	// connection limits (conn.go)
	headerTimeout, readTimeout, idleTimeout, writeTimeout time.Duration
	maxConns, maxConnsPerClient                           int
	reload                                                *reloadInfo // set by a Reloader
}

// Option configures New.
type Option func(*config)

// WithModelName is the model id clients name (default "xpu").
func WithModelName(name string) Option { return func(c *config) { c.name = name } }

// WithParallel is how many requests generate at once (default 1). Above 1 their runners are an
// llm.Batch: one copy of the weights, their decodes run as one step (see WithoutBatching).
func WithParallel(n int) Option { return func(c *config) { c.parallel = n } }

// WithContextShift lets generation go on past a full context as llama-server does: the first
// n_keep prompt tokens of the request (default 0, plus BOS) stay, half of the rest is discarded
// and generation continues (llm.WithContextShift). A request's max_tokens may then exceed the
// room its prompt leaves; the prompt itself must still fit the context.
func WithContextShift() Option { return func(c *config) { c.contextShift = true } }

// WithMaxTokens is the most tokens one request may ask for (default DefaultMaxTokens).
func WithMaxTokens(n int) Option { return func(c *config) { c.maxTokens = n } }

// WithMaxBodyBytes bounds a request body (default DefaultMaxBodyBytes).
func WithMaxBodyBytes(n int64) Option { return func(c *config) { c.maxBody = n } }

// WithRequestTimeout bounds a request from arrival to its last token, queueing included
// (default DefaultRequestTimeout).
func WithRequestTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithMaxQueue is how many requests may wait for a runner (default DefaultMaxQueue).
func WithMaxQueue(n int) Option { return func(c *config) { c.maxQueue = n } }

// WithLogger sets the logger (default slog.Default()); the server logs request failures at
// Warn and each request at Debug.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithRestartBackoff is the first wait between two failed attempts to rebuild the runners after
// the backend crashed (default DefaultRestartBackoff); it doubles after each failure, up to
// MaxRestartBackoff.
func WithRestartBackoff(d time.Duration) Option { return func(c *config) { c.restartBackoff = d } }

// WithoutSpecialTokens makes /v1/completions encode the texts of control tokens in a prompt
// ("<|im_start|>", "</s>") as plain text. By default they become the control tokens, as in
// llama.cpp's server: a raw prompt is the client's to format, turn markers included. Chat
// messages never have theirs parsed (llm.ChatTemplate.Prompt), with or without this option.
func WithoutSpecialTokens() Option { return func(c *config) { c.noSpecial = true } }

// WithChatOptions passes options to every runner's llm.Chat (a template override, stops).
func WithChatOptions(opts ...llm.ChatOption) Option {
	return func(c *config) { c.chatOption = append(c.chatOption, opts...) }
}

// Server answers the API for one loaded model. Create it with New, serve Handler, Close it
// after the http.Server has shut down.
type Server struct {
	cfg config
	eng *llm.Engine
	// mdl is the engine's model, read once: a crash rebuild replaces the engine's runner (through
	// which Engine.Model reads it) while other requests read the model
	mdl     *llm.Model
	tmpl    *llm.ChatTemplate
	tok     *tokenizer.Tokenizer
	ctxLen  int
	created int64
	slots   pool
	all     []*slot // every slot, held or not, for Close
	met     *metrics
	rec     recovery
	hooks   testHooks
	// grammars are recent json_schema requests' compiled grammars
	grammars grammarCache
	// batch, with parallel > 1, holds the slots' runners: their decodes run as one step
	batch *llm.Batch
	// embed serves /v1/embeddings, made at its first request (embeddings.go)
	embedMu sync.Mutex
	embed   *llm.Embedder
}

// testHooks let a test act at a chosen point of a request (kill the backend mid-stream); nil
// outside tests.
type testHooks struct {
	beforeGenerate func(attempt int)
	beforeSend     func(n int) // n: the pieces of text sent (or made, unstreamed) before this one
	// reply replaces the model's answer to a chat request (streamed in pieces of a few bytes),
	// so that a test controls what the "model" writes (tool calls)
	reply func() string
}

// slot is one runner and the chat state that lets it reuse its cache.
type slot struct {
	r      *llm.Runner
	chat   *llm.Chat
	engine bool   // r is the engine's own runner (rebuilt with Engine.RebuildRunner)
	epoch  uint64 // the backend restart r was built after (recovery.epoch)
	broken bool   // r crashed and is not rebuilt yet
	used   uint64 // when the slot was last given back (pool.clock)
}

// New prepares the runners of the pool on the engine's device. The engine's own runner is
// the pool's first: the caller must not generate with it while the server runs (after a
// crash of an isolated backend the server replaces it, Engine.RebuildRunner). The engine
// stays the caller's and must outlive the server.
func New(ctx context.Context, eng *llm.Engine, opts ...Option) (*Server, error) {
	cfg := config{name: "xpu", parallel: 1, maxTokens: DefaultMaxTokens, maxBody: DefaultMaxBodyBytes,
		timeout: DefaultRequestTimeout, maxQueue: DefaultMaxQueue, logger: slog.Default(),
		restartBackoff: DefaultRestartBackoff, headerTimeout: DefaultHeaderTimeout, readTimeout: DefaultReadTimeout,
		idleTimeout: DefaultIdleTimeout, writeTimeout: DefaultWriteTimeout, maxConns: DefaultMaxConns,
		maxConnsPerClient: DefaultMaxConnsPerClient}
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case cfg.name == "":
		return nil, fmt.Errorf("serve: empty model name: %w", core.ErrInvalidArgument)
	case cfg.parallel < 1 || cfg.parallel > 64:
		return nil, fmt.Errorf("serve: parallel %d: must be 1 to 64: %w", cfg.parallel, core.ErrInvalidArgument)
	case cfg.maxTokens < 1:
		return nil, fmt.Errorf("serve: max tokens %d: must be 1 or more: %w", cfg.maxTokens, core.ErrInvalidArgument)
	case cfg.maxBody < 1:
		return nil, fmt.Errorf("serve: max body %d: must be 1 or more: %w", cfg.maxBody, core.ErrInvalidArgument)
	case cfg.timeout <= 0:
		return nil, fmt.Errorf("serve: request timeout %s: must be positive: %w", cfg.timeout, core.ErrInvalidArgument)
	case cfg.maxQueue < 0:
		return nil, fmt.Errorf("serve: max queue %d: must be 0 or more: %w", cfg.maxQueue, core.ErrInvalidArgument)
	case cfg.restartBackoff <= 0:
		return nil, fmt.Errorf("serve: restart backoff %s: must be positive: %w", cfg.restartBackoff, core.ErrInvalidArgument)
	case cfg.headerTimeout <= 0 || cfg.readTimeout <= 0 || cfg.idleTimeout <= 0 || cfg.writeTimeout <= 0:
		return nil, fmt.Errorf("serve: header, read, idle and write timeouts (%s, %s, %s, %s): must be positive: %w",
			cfg.headerTimeout, cfg.readTimeout, cfg.idleTimeout, cfg.writeTimeout, core.ErrInvalidArgument)
	case cfg.maxConns < 0 || cfg.maxConnsPerClient < 0:
		return nil, fmt.Errorf("serve: max connections %d, per client %d: must be 0 (no limit) or more: %w",
			cfg.maxConns, cfg.maxConnsPerClient, core.ErrInvalidArgument)
	}
	s := &Server{cfg: cfg, eng: eng, mdl: eng.Model(), tok: eng.Model().Tokenizer, ctxLen: eng.ContextLength(),
		created: time.Now().Unix(), met: newMetrics()}
	s.rec.ctx, s.rec.cancel = context.WithCancel(context.Background())
	s.met.restarts = s.rec.restarts.Load
	s.met.changed = func() bool {
		detached, err := s.modelChanged()
		return detached || err != nil
	}
	if err := s.newBatch(ctx); err != nil {
		return nil, err
	}
	if s.batch == nil {
		s.all = append(s.all, &slot{r: eng.Runner, engine: true})
	}
	for len(s.all) < cfg.parallel {
		r, err := eng.NewRunner(ctx)
		if err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("serve: runner %d of %d: %w", len(s.all)+1, cfg.parallel, err)
		}
		s.all = append(s.all, &slot{r: r})
	}
	for _, sl := range s.all {
		chat, err := llm.NewChat(sl.r, cfg.chatOption...)
		if err != nil {
			_ = s.Close()
			return nil, err
		}
		s.tmpl = chat.Template()
		sl.chat = chat
	}
	for _, sl := range s.all {
		s.slots.put(sl)
	}
	return s, nil
}

// Close stops the rebuilds still under way and releases the runners the server prepared (not
// the engine's).
func (s *Server) Close() error {
	if s.rec.cancel != nil {
		s.rec.cancel()
	}
	s.rec.wg.Wait()
	var errs []error
	for _, sl := range s.all {
		if !sl.engine {
			errs = append(errs, sl.r.Close())
		}
	}
	s.all = nil
	if s.batch != nil {
		errs = append(errs, s.batch.Close())
		s.batch = nil
	}
	errs = append(errs, s.closeEmbedder())
	return errors.Join(errs...)
}

// Handler routes the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/chat/completions", s.post(s.chat))
	mux.HandleFunc("/v1/completions", s.post(s.complete))
	mux.HandleFunc("/v1/embeddings", s.post(s.embeddings))
	mux.HandleFunc("/v1/models", s.get(s.models))
	mux.HandleFunc("/health", s.get(s.health))
	mux.HandleFunc("/metrics", s.get(s.metrics))
	s.routes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, newError(http.StatusNotFound, "invalid_request_error", "", "unknown_url",
			"unknown URL %s %s", r.Method, r.URL.Path))
	})
	timed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(newTimedWriter(w, s.cfg.writeTimeout), r)
	})
	return s.met.instrument(timed)
}

func (s *Server) get(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			writeError(w, newError(http.StatusMethodNotAllowed, "invalid_request_error", "", "method_not_allowed",
				"%s %s: use GET", r.Method, r.URL.Path))
			return
		}
		h(w, r)
	}
}

func (s *Server) post(h func(http.ResponseWriter, *http.Request) *apiError) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			writeError(w, newError(http.StatusMethodNotAllowed, "invalid_request_error", "", "method_not_allowed",
				"%s %s: use POST", r.Method, r.URL.Path))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.maxBody)
		if e := h(w, r); e != nil {
			lvl := slog.LevelDebug // the client's mistake, answered in the body
			if e.status >= 500 {
				lvl = slog.LevelWarn
			}
			s.cfg.logger.Log(r.Context(), lvl, "serve: request failed", "path", r.URL.Path, "status", e.status, "err", e.Message)
			writeError(w, e)
		}
	}
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: []modelInfo{{ID: s.cfg.name,
		Object: "model", Created: s.created, OwnedBy: "xpu"}}})
}

// health answers 200 {"status": "ok"} while the backend can answer, and 503
// {"status": "unhealthy", "error"} from a crash until the runners are rebuilt, or once the
// model file changed under weights the server could not keep; both say how many times the
// backend was restarted and when it was last, and "model_file" says when the file on disk is
// no longer the one being served.
func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	st := map[string]any{"status": "ok", "model": s.cfg.name, "device": s.eng.Device().Info().ID(),
		"queued": s.slots.waiting(), "restarts": s.rec.restarts.Load()}
	if t := s.rec.lastRestart.Load(); t != nil {
		st["last_restart"] = t.UTC().Format(time.RFC3339Nano)
	}
	detached, err := s.modelChanged()
	if ri := s.cfg.reload; ri != nil {
		st["reloads"] = ri.count.Load()
		if t := ri.last.Load(); t != nil {
			st["last_reload"] = t.UTC().Format(time.RFC3339Nano)
		}
		if e := ri.lastErr.Load(); e != nil && (detached || err != nil) {
			st["reload_error"] = *e
		}
	}
	switch {
	case detached && s.cfg.reload != nil:
		st["model_file"] = "changed on disk; serving the weights loaded before it changed until the new file loads"
	case detached:
		st["model_file"] = "changed on disk; serving the weights loaded before it changed (restart to serve the new file)"
	}
	if err == nil {
		err = s.eng.Healthy()
	}
	if err == nil && s.rec.broken.Load() > 0 {
		err = errors.New("a runner is being rebuilt after a backend crash")
		if c := s.rec.lastCrash.Load(); c != nil {
			err = fmt.Errorf("%s; last crash: %s", err, *c)
		}
	}
	if err != nil {
		st["status"], st["error"] = "unhealthy", err.Error()
		writeJSON(w, http.StatusServiceUnavailable, st)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	s.met.write(w, int64(s.slots.waiting()), s.slots.idle(), s.cfg.parallel)
	if ri := s.cfg.reload; ri != nil {
		fmt.Fprintln(w, "# HELP xpu_model_reloads_total Times the model was loaded again after its file changed on disk.")
		fmt.Fprintln(w, "# TYPE xpu_model_reloads_total counter")
		fmt.Fprintf(w, "xpu_model_reloads_total %d\n", ri.count.Load())
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.status, map[string]*apiError{"error": e})
}

// decode reads a JSON body, telling a body over the limit (413) from bad JSON (400). The body
// is one JSON value: anything but white space after it is refused, so that a client never has
// part of what it sent silently ignored.
func decode(r *http.Request, v any) *apiError {
	dec := json.NewDecoder(r.Body)
	err := dec.Decode(v)
	if err == nil {
		var extra json.RawMessage
		switch err = dec.Decode(&extra); {
		case errors.Is(err, io.EOF):
			err = nil
		case err == nil:
			return badRequest("", "invalid_json", "invalid JSON body: data after the JSON value (%.20q...)", extra)
		}
	}
	var tooBig *http.MaxBytesError
	var netErr net.Error
	switch {
	case errors.As(err, &netErr) && netErr.Timeout():
		return newError(http.StatusRequestTimeout, "invalid_request_error", "", "request_timeout",
			"the request body did not arrive within the read timeout")
	case errors.As(err, &tooBig):
		return newError(http.StatusRequestEntityTooLarge, "invalid_request_error", "", "request_too_large",
			"request body over %d bytes", tooBig.Limit)
	case errors.Is(err, io.EOF):
		return badRequest("", "invalid_json", "empty request body")
	case err != nil:
		return badRequest("", "invalid_json", "invalid JSON body: %v", err)
	}
	return nil
}

// job is a validated request, ready to run on a runner.
type job struct {
	sampler   llm.SamplerConfig
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

// maxCachedGrammars bounds the compiled json_schema grammars a server keeps.
const maxCachedGrammars = 32

// grammarCache keeps the grammars of recent json_schema requests by schema text: an app that
// sends the same schema every time gets the grammar, and the token masks its earlier answers
// computed, without compiling it again.
type grammarCache struct {
	mu    sync.Mutex
	byKey map[string]*grammar.Grammar
	order []string // oldest first
}

func (c *grammarCache) get(schema []byte) (*grammar.Grammar, error) {
	key := string(schema)
	c.mu.Lock()
	g := c.byKey[key]
	c.mu.Unlock()
	if g != nil {
		return g, nil
	}
	g, err := grammar.FromSchema(schema)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byKey == nil {
		c.byKey = map[string]*grammar.Grammar{}
	}
	if _, ok := c.byKey[key]; !ok {
		if len(c.order) >= maxCachedGrammars {
			delete(c.byKey, c.order[0])
			c.order = c.order[1:]
		}
		c.byKey[key] = g
		c.order = append(c.order, key)
	}
	return g, nil
}

// responseGrammar compiles response_format into the grammar generation is held to (nil for
// text).
func (c *grammarCache) responseGrammar(f *responseFormat) (*grammar.Grammar, *apiError) {
	if f == nil {
		return nil, nil
	}
	switch f.Type {
	case "", "text":
		return nil, nil
	case "json_object":
		return grammar.JSON(), nil
	case "json_schema":
		if f.JSONSchema == nil || len(f.JSONSchema.Schema) == 0 || string(f.JSONSchema.Schema) == "null" {
			return nil, badRequest("response_format.json_schema.schema", "invalid_value",
				"response_format json_schema needs json_schema.schema")
		}
		g, err := c.get(f.JSONSchema.Schema)
		if err != nil {
			name := f.JSONSchema.Name
			if name == "" {
				name = "(unnamed)"
			}
			return nil, badRequest("response_format.json_schema.schema", "invalid_value",
				"response_format json_schema %s: %v", name, err)
		}
		return g, nil
	}
	return nil, badRequest("response_format", "unsupported_value",
		"response_format %q is not supported (text, json_object or json_schema)", f.Type)
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
		usage: q.StreamOptions != nil && q.StreamOptions.IncludeUsage}
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
	msgs := make([]llm.Message, len(q.Messages))
	for i, m := range q.Messages {
		if !validRoles[m.Role] {
			return badRequest(fmt.Sprintf("messages[%d].role", i), "invalid_value",
				"role %q: must be system, developer, user, assistant or tool", m.Role)
		}
		role := m.Role
		if role == "developer" { // OpenAI's newer name for the system role
			role = "system"
		}
		msgs[i] = llm.Message{Role: role, Content: string(m.Content), ToolCallID: m.ToolCallID}
		for _, c := range m.ToolCalls {
			msgs[i].ToolCalls = append(msgs[i].ToolCalls, llm.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
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
	case errors.Is(err, llm.ErrTemplateLimit):
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
		case *q.TopLogprobs < 0 || *q.TopLogprobs > llm.MaxTopLogprobs:
			return badRequest("top_logprobs", "invalid_value", "top_logprobs %d: must be 0 to %d", *q.TopLogprobs, llm.MaxTopLogprobs)
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
	choice := func(i int, lps *[]llm.TokenLogprob) []llm.GenerateOption {
		sc := j.sampler
		sc.Seed += uint64(i)
		if j.logprobs {
			sc.Logprobs = func(l llm.TokenLogprob) { *lps = append(*lps, l) }
		}
		opts := append(j.genOptions(), llm.WithSampler(sc))
		if j.grammar != nil {
			opts = append(opts, llm.WithConstraint(llm.GrammarConstraint(s.tok, j.grammar)))
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
		piece := func(i int, text string, lps []llm.TokenLogprob, finish *string, offset *int) response {
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
			if chat {
				first := response{ID: id, Object: chunkObject, Created: created, Model: s.cfg.name,
					Choices: []chatChoice{{Index: i, Delta: &delta{Role: "assistant"}}}}
				if err := send(first); err != nil {
					return fail() // the client is gone
				}
			} else if j.echo != "" {
				offset = 0
				if err := send(piece(i, j.echo, nil, nil, &offset)); err != nil {
					return fail()
				}
			}
			var lps []llm.TokenLogprob
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
				return send(p)
			}
			opts := append(choice(i, &lps), llm.WithStream(stream))
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
					_ = send(piece(i, heldText.String(), lps[sentLps:], nil, &offset))
					sentLps = len(lps)
				}
			}
			_ = send(piece(i, "", lps[min(sentLps, len(lps)):], &fin, &offset))
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
		lps []llm.TokenLogprob
	}
	outs := make([]outcome, j.n)
	s.eachChoice(held, j.n, func(k, i int) bool {
		var lps []llm.TokenLogprob
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
func (s *Server) chatLogprobs(j *job, lps []llm.TokenLogprob) *chatLogprobs {
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
func (s *Server) textLogprobs(j *job, lps []llm.TokenLogprob, offset *int) *textLogprobs {
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
