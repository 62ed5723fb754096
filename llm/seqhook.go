package llm

import (
	"context"
	"fmt"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// SequenceHook serves a runner's Prefill and Decode in its place (WithSequenceHook): continuous
// batching (package batch) runs the tokens of several runners as shared steps over one copy of
// the weights. The runner keeps its programs, positions, history and checks; the hook runs
// tokens through the runner's programs (Sequence.Feed), or through programs of its own over the
// cache it gave the runner and then records them (Sequence.Commit).
type SequenceHook interface {
	// Attach hands the hook the runner's sequence before the runner prepares its programs, and
	// returns the runner's K and V cache per layer: capacity rows of rowBytes[0] (K) and
	// rowBytes[1] (V) bytes each, in the arena of the runner's runtime (nil: a cache of the
	// runner's own). A runner retried with another cache dtype attaches again, on a new runtime.
	Attach(s *Sequence, capacity int64, rowBytes [2]int64) ([][2]sched.Span, error)
	// Prefill serves Runner.Prefill.
	Prefill(ctx context.Context, tokens []int32) ([]float32, error)
	// Decode serves Runner.Decode.
	Decode(ctx context.Context, token int32) ([]float32, error)
}

// WithSequenceHook has h serve the runner's Prefill and Decode over a cache h gives. It does not
// combine with a projection hook, a chunk hook, verify lengths or hidden-state output
// (core.ErrUnsupported): the hook's programs are built from the model's own blocks.
func WithSequenceHook(h SequenceHook) RunnerOption { return func(c *runnerConfig) { c.seq = h } }

// attachSequence checks the runner's options against its sequence hook and takes its cache from
// the hook.
func (r *Runner) attachSequence(rowBytes [2]int64) ([][2]sched.Span, error) {
	if c := r.cfg; c.proj != nil || c.chunkHook != nil || len(c.verify) > 0 || c.hidden {
		return nil, fmt.Errorf("llm: a sequence hook (a batch) with a projection hook (W8A8 weights), a chunk hook (the sparse FFN), verify lengths or hidden-state output: %w",
			core.ErrUnsupported)
	}
	return r.cfg.seq.Attach(&Sequence{r: r}, r.cap, rowBytes)
}

// Sequence is a runner as its SequenceHook sees it: the runner's programs and the record of the
// tokens in its cache.
type Sequence struct{ r *Runner }

// Runner is the sequence's runner.
func (s *Sequence) Runner() *Runner { return s.r }

// PhaseOptions are the prepare options of phase p's programs on a CPU unit (WithPhaseOptions),
// which the hook's programs of that phase take too.
func (s *Sequence) PhaseOptions(p sched.Phase) map[string]string { return s.r.cfg.phaseOpts[p] }

// Prepare prepares the runner's stage programs of chunk length c (1 up to the prefill chunk),
// unless it has them.
func (s *Sequence) Prepare(ctx context.Context, c int) error {
	r := s.r
	if c < 1 || c > r.cfg.chunk {
		return fmt.Errorf("llm: chunk length %d (1 to the runner's %d): %w", c, r.cfg.chunk, core.ErrInvalidArgument)
	}
	if _, ok := r.progs[c]; ok {
		return nil
	}
	cp, err := r.prepare(ctx, int64(c), func() {}, false)
	if err != nil {
		return err
	}
	r.progs[c] = cp
	return nil
}

// Feed runs tokens through the runner's programs of chunk length c (0: the prefill chunk;
// others once prepared), as Prefill does, and returns the logits after the last token.
func (s *Sequence) Feed(ctx context.Context, tokens []int32, c int) ([]float32, error) {
	if c == 0 {
		c = s.r.cfg.chunk
	}
	cp, ok := s.r.progs[c]
	if !ok {
		return nil, fmt.Errorf("llm: no programs of chunk length %d (Sequence.Prepare): %w", c, core.ErrInvalidArgument)
	}
	return s.r.feed(ctx, tokens, cp, nil)
}

// Check is Feed's check of tokens, for tokens the hook runs itself: the runner is open, and they
// fit in the cache and in the vocabulary.
func (s *Sequence) Check(tokens []int32) error { return s.r.checkFeed(tokens) }

// Commit records tokens, which the hook's programs ran, as the next in the cache: their K and V
// rows are written at the sequence's positions from Runner.Len on.
func (s *Sequence) Commit(tokens []int32) {
	s.r.pos += len(tokens)
	s.r.history = append(s.r.history, tokens...)
}

// checkFeed is feed's argument check.
func (r *Runner) checkFeed(tokens []int32) error {
	if r.closed {
		return fmt.Errorf("llm: runner is closed: %w", core.ErrBadState)
	}
	if r.pos+len(tokens) > r.cfg.ctxLen {
		return fmt.Errorf("%w: %d tokens in the cache + %d new > context length %d",
			ErrContextFull, r.pos, len(tokens), r.cfg.ctxLen)
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= r.m.Config.Vocab {
			return fmt.Errorf("llm: token %d outside the vocabulary of %d: %w", t, r.m.Config.Vocab, core.ErrInvalidArgument)
		}
	}
	return nil
}
