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
// queue is full. With several, the runners are one batch.Batch (batch.go): one copy of the
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
// parsed (prompt.Template.Prompt); a raw /v1/completions prompt has them parsed, as
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
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/batch"
	"github.com/xpuhub/xpu/llm/embed"
	"github.com/xpuhub/xpu/llm/prompt"
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
// batch.Batch: one copy of the weights, their decodes run as one step (see WithoutBatching).
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
// messages never have theirs parsed (prompt.Template.Prompt), with or without this option.
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
	tmpl    *prompt.Template
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
	batch *batch.Batch
	// embed serves /v1/embeddings, made at its first request (embeddings.go)
	embedMu sync.Mutex
	embed   *embed.Embedder
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
