package llm

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/xpuhub/xpu/llm/sample"
)

// Strategy decodes in place of Generate's own loop, which samples one token per decode step:
// speculative decoding (package spec) is one. Generate keeps what every generation shares (the
// prompt and the cache's reuse, checking the options, decoding and streaming the text, stop
// tokens, the token budget, the result and its timings); the strategy chooses how the tokens
// are computed and hands each one to Generation.Emit.
type Strategy interface {
	// Begin checks the strategy against the runner before anything changes, and may set the
	// generation's report (Generation.SetReport).
	Begin(g *Generation) error
	// Prefill feeds the prompt's tokens and returns the logits after the last one;
	// Runner.Prefill is the plain way.
	Prefill(ctx context.Context, g *Generation, ids []int32) ([]float32, error)
	// Decode continues from the prompt's logits. It emits every token it chooses, in order,
	// until Emit reports the generation done, it ends the generation itself (Generation.Stop),
	// or an error.
	Decode(ctx context.Context, g *Generation, logits []float32) error
	// Finish is called after a generation that ended without error.
	Finish(g *Generation, res Result)
}

// WithStrategy decodes with s instead of Generate's own loop (nil: the own loop). It does not
// combine with WithConstraint, which holds the own loop's sampling to a grammar.
func WithStrategy(s Strategy) GenerateOption { return func(c *genConfig) { c.strategy = s } }

// Generation is one Generate call as its Strategy sees it. Its methods are called from the
// strategy's own calls, on Generate's goroutine.
type Generation struct {
	r       *Runner
	cfg     *genConfig
	res     *Result
	dec     interface{ Next(int32) string }
	text    *[]byte
	sampler *sample.Sampler
}

// Runner is the runner generating; the context Generate hands the strategy lets it call the
// runner's methods (the runner is held by Generate).
func (g *Generation) Runner() *Runner { return g.r }

// Sampler is the generation's sampler (WithSampler's configuration, seeded once per Generate).
func (g *Generation) Sampler() *sample.Sampler { return g.sampler }

// Greedy says whether the sampler picks the most likely token (temperature 0).
func (g *Generation) Greedy() bool { return g.cfg.sampler.Temperature <= 0 }

// Logger is the runner's logger (WithLogger).
func (g *Generation) Logger() *slog.Logger { return g.r.cfg.logger }

// Tokens are the tokens emitted so far: the generation's own slice, to read before the next
// Emit.
func (g *Generation) Tokens() []int32 { return g.res.Tokens }

// Remaining is how many more tokens the budget (WithMaxTokens) allows.
func (g *Generation) Remaining() int { return g.cfg.maxTokens - len(g.res.Tokens) }

// Emit hands over the next token: a stop token (or BOS) ends the generation with StopEOS;
// any other is appended to the result, given to WithTokenCallback and, as text, to
// WithStream, and ends it with StopMaxTokens when the budget is spent. done says the
// generation is over; a callback's error is returned.
func (g *Generation) Emit(id int32) (done bool, err error) {
	tok := g.r.m.Tokenizer
	if tok.IsStop(id) || (id == tok.BOS() && id >= 0) {
		g.res.Stop = StopEOS
		return true, nil
	}
	g.res.Tokens = append(g.res.Tokens, id)
	if g.cfg.onToken != nil {
		if err := g.cfg.onToken(id); err != nil {
			return true, err
		}
	}
	if piece := g.dec.Next(id); piece != "" {
		*g.text = append(*g.text, piece...)
		if g.cfg.stream != nil {
			if err := g.cfg.stream(piece); err != nil {
				return true, err
			}
		}
	}
	if len(g.res.Tokens) >= g.cfg.maxTokens {
		g.res.Stop = StopMaxTokens
		return true, nil
	}
	return false, nil
}

// Stop ends the generation for why (the strategy returns next).
func (g *Generation) Stop(why StopReason) { g.res.Stop = why }

// Stopped is why the generation ended ("" while it runs).
func (g *Generation) Stopped() StopReason { return g.res.Stop }

// Shifts says whether a full context shifts (WithContextShift) rather than ending the
// generation with StopContext.
func (g *Generation) Shifts() bool { return g.cfg.shift != nil }

// Shift makes room in a full cache as WithContextShift says and returns how many rows it
// discarded; ErrNoShift when the kept rows leave nothing to discard (the generation then ends
// with StopContext).
func (g *Generation) Shift(ctx context.Context) (int, error) {
	if g.cfg.shift == nil {
		return 0, fmt.Errorf("%w: the generation has no context shift (WithContextShift)", ErrNoShift)
	}
	return g.r.shiftFull(ctx, g.cfg.keepRows)
}

// SetReport sets what the strategy reports of the generation (Result.Strategy).
func (g *Generation) SetReport(rep fmt.Stringer) { g.res.Strategy = rep }

// Report is what SetReport set, nil before.
func (g *Generation) Report() fmt.Stringer { return g.res.Strategy }
