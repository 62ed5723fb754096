package llm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/sample"
	"github.com/xpuhub/xpu/sched/energy"
)

// StopReason says why generation ended.
type StopReason string

// Stop reasons.
const (
	StopEOS       StopReason = "eos"        // the model emitted an end or stop token
	StopMaxTokens StopReason = "max-tokens" // the token budget was spent
	StopContext   StopReason = "context"    // the KV cache is full
)

// Result reports a generation.
type Result struct {
	Text         string
	Tokens       []int32 // generated tokens (without the stop token)
	PromptTokens int     // the prompt tokens fed (prefilled) for this generation
	// CachedTokens is how many of the prompt's tokens were already in the cache and not fed
	// again (WithPromptCache); the prompt is CachedTokens + PromptTokens long.
	CachedTokens int
	Stop         StopReason
	Prefill      time.Duration
	Decode       time.Duration
	// DecodeCPU is the CPU time (user + system) this process spent while decoding: every thread
	// of it, the in-process backends' workers included (an isolated backend's child process is
	// not). On a machine whose other processes take turns on the cores it moves far less than
	// Decode. 0 where the platform does not report it.
	DecodeCPU time.Duration
	// Strategy is what a decode strategy reports of the generation (WithStrategy; package
	// spec's *spec.Stats for speculative decoding), nil with Generate's own loop.
	Strategy fmt.Stringer
}

// PrefillTokensPerSecond is the prompt processing speed.
func (r Result) PrefillTokensPerSecond() float64 { return rate(r.PromptTokens, r.Prefill) }

// DecodeTokensPerSecond is the generation speed (the first token comes from prefill).
func (r Result) DecodeTokensPerSecond() float64 {
	return rate(max(len(r.Tokens)-1, 0), r.Decode)
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

type genConfig struct {
	maxTokens int
	sampler   sample.Config
	stream    func(text string) error
	onToken   func(id int32) error
	keep      bool
	reuse     bool    // WithPromptCache
	ids       []int32 // WithPromptTokens: fed instead of the prompt's encoding
	strategy  Strategy
	// constraint holds sampling to a grammar (WithConstraint)
	constraint sample.Constraint
	// shift, when set, is the keep count of a context shift at a full cache (WithContextShift)
	shift    *int
	keepRows int // the rows a shift keeps, from shift and the prompt
}

// GenerateOption configures Generate.
type GenerateOption func(*genConfig)

// WithMaxTokens bounds the generated tokens (default 256; 0 only prefills the prompt; a
// negative count makes Generate fail with core.ErrInvalidArgument).
func WithMaxTokens(n int) GenerateOption { return func(c *genConfig) { c.maxTokens = n } }

// WithSampler sets the sampling (default greedy); Generate fails with
// core.ErrInvalidArgument when s is out of range (see sample.Config.Validate).
func WithSampler(s sample.Config) GenerateOption { return func(c *genConfig) { c.sampler = s } }

// WithConstraint holds sampling to c (see sample.Constraint): a grammar, a JSON Schema
// (grammar.NewTokenMatcher). It cannot be combined with speculative decoding (Generate fails
// with core.ErrInvalidArgument).
func WithConstraint(c sample.Constraint) GenerateOption {
	return func(g *genConfig) { g.constraint = c }
}

// WithStream receives the text as it is generated; an error stops generation and is returned.
func WithStream(f func(text string) error) GenerateOption {
	return func(c *genConfig) { c.stream = f }
}

// WithTokenCallback receives each generated token id.
func WithTokenCallback(f func(id int32) error) GenerateOption {
	return func(c *genConfig) { c.onToken = f }
}

// WithKeepCache continues from the tokens already in the cache instead of starting over (a
// chat's next turn).
func WithKeepCache() GenerateOption { return func(c *genConfig) { c.keep = true } }

// WithPromptCache reuses the longest prefix that the prompt's tokens (with BOS when the
// vocabulary asks for it, or those of WithPromptTokens) share with the tokens in the cache: the
// cache is truncated to that prefix and only the rest is prefilled, so that a request resending
// a conversation, or any prompt sharing a beginning with the last one, skips the shared part.
// At least the prompt's last token is fed, for its logits. Result.CachedTokens says how many
// were reused. WithKeepCache takes precedence: it continues after the whole cache.
func WithPromptCache() GenerateOption { return func(c *genConfig) { c.reuse = true } }

// WithPromptTokens feeds ids instead of encoding the prompt string (which is then ignored):
// a chat continuing its cache feeds the tokens the whole conversation encodes to past the
// cached ones, which encoding the new text alone would not always give (SentencePiece adds a
// space at the start of every encoded text).
func WithPromptTokens(ids []int32) GenerateOption { return func(c *genConfig) { c.ids = ids } }

// Generate encodes prompt (with BOS when the vocabulary asks for it), prefills it in chunks and
// samples until a stop token, the token budget or the end of the context (or, with
// WithContextShift, goes on past it by shifting the context). Generation also stops
// when the model emits BOS, which starts a new document in models such as TinyStories.
// Logits that are not finite end it with ErrNonFinite. Tokens are only sampled from the
// tokenizer's vocabulary: embedding rows past it (padding some conversions add) have no text.
func (r *Runner) Generate(ctx context.Context, prompt string, opts ...GenerateOption) (Result, error) {
	ctx, leave, err := r.enter(ctx)
	if err != nil {
		return Result{}, err
	}
	defer leave()
	cfg := genConfig{maxTokens: 256}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.maxTokens < 0 {
		return Result{}, fmt.Errorf("llm: max tokens %d: must be 0 or more: %w", cfg.maxTokens, core.ErrInvalidArgument)
	}
	if err := cfg.sampler.Validate(); err != nil {
		return Result{}, err
	}
	// a model file overwritten under an unguarded mapping would fault on the first weight read
	if err := r.m.File.Check(); err != nil {
		return Result{}, fmt.Errorf("llm: %w", err)
	}
	if cfg.constraint != nil && cfg.strategy != nil {
		return Result{}, fmt.Errorf("llm: a constraint cannot be combined with a decode strategy (speculative decoding): %w", core.ErrInvalidArgument)
	}
	var res Result
	var text []byte
	dec := r.m.Tokenizer.NewDecoder()
	g := &Generation{r: r, cfg: &cfg, res: &res, dec: dec, text: &text, sampler: sample.New(cfg.sampler)}
	if cfg.strategy != nil {
		if err := cfg.strategy.Begin(g); err != nil {
			return Result{}, err
		}
	}
	tok := r.m.Tokenizer
	ids := cfg.ids
	if ids == nil {
		ids = tok.Encode(prompt, !cfg.keep)
	}
	cached := 0
	switch {
	case cfg.keep:
	case cfg.reuse && len(ids) > 0:
		// the last token is fed even when the cache holds it: its logits start generation
		cached = min(r.CachedPrefix(ids), len(ids)-1)
		if err := r.Truncate(cached); err != nil {
			return Result{}, err
		}
		ids = ids[cached:]
	default:
		r.Reset()
	}
	if len(ids) == 0 {
		why := "the vocabulary has no BOS token"
		if !tok.Vocab().AddBOS && tok.BOS() >= 0 {
			why = "the vocabulary asks for no BOS token"
		}
		return Result{}, fmt.Errorf("llm: empty prompt and %s: %w", why, core.ErrInvalidArgument)
	}
	res.PromptTokens, res.CachedTokens = len(ids), cached
	for _, id := range ids {
		dec.Next(id) // the generated text continues the prompt's (no dummy-prefix stripping)
	}
	t0 := time.Now()
	var logits []float32
	if cfg.strategy != nil {
		logits, err = cfg.strategy.Prefill(ctx, g, ids)
	} else {
		logits, err = r.Prefill(ctx, ids)
	}
	res.Prefill = time.Since(t0)
	if err != nil {
		return res, err
	}
	if err := CheckLogits(logits, r.pos-1); err != nil {
		return res, err
	}
	if cfg.shift != nil {
		cfg.keepRows = r.shiftKeep(*cfg.shift, r.pos)
	}
	if cfg.maxTokens == 0 {
		res.Stop = StopMaxTokens
		return res, nil
	}
	t1, c1 := time.Now(), cpuTime()
	if cfg.strategy != nil {
		err := cfg.strategy.Decode(ctx, g, logits)
		if err == nil {
			text = r.flushText(dec, text, &cfg, &err)
		}
		res = r.finish(res, text, t1, c1)
		if err == nil {
			cfg.strategy.Finish(g, res)
		}
		return res, err
	}
	sampler := g.sampler
	held := sample.Constrain(sampler, cfg.constraint)
	for {
		next, err := held.Sample(logits[:min(len(logits), tok.Size())], r.history)
		if err != nil {
			return r.finish(res, text, t1, c1), fmt.Errorf("llm: %w", err)
		}
		done, err := g.Emit(next)
		if err != nil {
			return r.finish(res, text, t1, c1), err
		}
		if held.Done() && (!done || res.Stop == StopMaxTokens) {
			res.Stop = StopEOS // the grammar is complete: nothing may follow
			break
		}
		if done {
			break
		}
		if r.pos >= r.cfg.ctxLen {
			if cfg.shift == nil {
				res.Stop = StopContext
				break
			}
			if _, err := r.shiftFull(ctx, cfg.keepRows); errors.Is(err, ErrNoShift) {
				res.Stop = StopContext
				break
			} else if err != nil {
				return r.finish(res, text, t1, c1), err
			}
		}
		if logits, err = r.Decode(ctx, next); err != nil {
			return r.finish(res, text, t1, c1), err
		}
		if err := CheckLogits(logits, r.pos-1); err != nil {
			return r.finish(res, text, t1, c1), err
		}
	}
	var ferr error
	text = r.flushText(dec, text, &cfg, &ferr)
	return r.finish(res, text, t1, c1), ferr
}

// flushText appends the decoder's held-back bytes, streaming them; a stream error goes to *err.
func (r *Runner) flushText(dec interface{ Flush() string }, text []byte, cfg *genConfig, err *error) []byte {
	if rest := dec.Flush(); rest != "" {
		text = append(text, rest...)
		if cfg.stream != nil {
			*err = cfg.stream(rest)
		}
	}
	return text
}

func (r *Runner) finish(res Result, text []byte, t1 time.Time, c1 time.Duration) Result {
	res.Text = string(text)
	res.Decode = time.Since(t1)
	if c1 > 0 {
		res.DecodeCPU = cpuTime() - c1
	}
	return res
}

// cpuTime is the CPU time this process has used so far (0 where the platform does not say).
func cpuTime() time.Duration {
	t, err := energy.ProcessCPUTime()
	if err != nil {
		return 0
	}
	return t
}
