package llm

import (
	"context"
	"fmt"
	"slices"

	"github.com/xpuhub/xpu/core"
)

// A VerifyHook prepares, besides the prefill and decode programs, verify programs: programs of
// chunk lengths of its own that append given tokens in one pass and hand over every token's
// logits, with a tree mask where the units take one (WithVerifyHook). Speculative decoding
// (package spec) scores its drafts with them. A hook may serve several runners: Attach makes its
// part of one.
type VerifyHook interface {
	// Lengths are the verify programs' chunk lengths; the cache gets room for the padding of
	// the longest. NewRunner refuses a length under 2 or over the context length.
	Lengths() []int
	// Attach prepares one runner's verify programs (Seam.Prepare of its lengths), after the
	// runner's own programs. What it returns is the runner's Verifier.
	Attach(ctx context.Context, s *Seam) (any, error)
}

// WithVerifyHook prepares h's verify programs. It does not combine with a chunk hook (the sparse
// FFN), hidden-state output or a batch (core.ErrUnsupported).
func WithVerifyHook(h VerifyHook) RunnerOption {
	return func(c *runnerConfig) {
		c.verifyHook, c.verify = h, nil
		if h != nil {
			c.verify = slices.Compact(slices.Sorted(slices.Values(h.Lengths())))
		}
	}
}

func checkVerifyLengths(ls []int, ctxLen int) error {
	for _, l := range ls {
		if l < 2 || l > ctxLen {
			return fmt.Errorf("llm: verify length %d: must be between 2 and the context length %d: %w",
				l, ctxLen, core.ErrInvalidArgument)
		}
	}
	return nil
}

// Verifier is what the runner's VerifyHook attached (WithVerifyHook), nil without one.
func (r *Runner) Verifier() any { return r.verify }

// attachVerify attaches the verify hook, which prepares its programs.
func (r *Runner) attachVerify(ctx context.Context, step func()) error {
	if r.cfg.verifyHook == nil {
		return nil
	}
	v, err := r.cfg.verifyHook.Attach(ctx, &Seam{r: r, step: step})
	r.verify = v
	return err
}

// programLengths are the chunk lengths of the prefill and decode graphs, ascending: decoding
// (1) and the prefill chunk.
func (r *Runner) programLengths() []int {
	if r.cfg.chunk == 1 {
		return []int{1}
	}
	return []int{1, r.cfg.chunk}
}

// PrefillEachLoses says whether PrefillEach gives up something Prefill has: chunks pipelined
// over several units, or the sparse FFN's programs.
func (r *Runner) PrefillEachLoses() bool {
	cp := r.progs[r.cfg.chunk]
	return cp.hp != nil || cp.prog.Lanes() > 1
}

// PrefillEach is Prefill that also hands f the logits after every token (i indexes tokens; the
// slice is only valid during the call): a prompt's all-position predictions, which in-context
// calibration drafts from. Chunks then run one at a time, without pipelining across units.
func (r *Runner) PrefillEach(ctx context.Context, tokens []int32, f func(i int, logits []float32) error) ([]float32, error) {
	ctx, leave, err := r.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	if f == nil {
		return r.Prefill(ctx, tokens)
	}
	buf := make([]float32, r.outWidth())
	return r.feed(ctx, tokens, r.progs[r.cfg.chunk], func(i int, row []byte) error {
		core.DecodeF32To(buf, row[:4*len(buf)])
		return f(i, buf)
	})
}

// Truncate keeps the first n tokens of the cache (rollback): rows past them are overwritten by
// the next tokens fed, and until then attention never reads them.
func (r *Runner) Truncate(n int) error {
	if n < 0 || n > r.pos {
		return fmt.Errorf("llm: truncate to %d tokens: the cache holds %d: %w", n, r.pos, core.ErrInvalidArgument)
	}
	r.pos = n
	r.history = r.history[:n]
	return nil
}
