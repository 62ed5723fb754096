package llm

import (
	"context"
	"errors"
	"fmt"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/kvcache"
	"github.com/xpuhub/xpu/sched"
)

// Context shift, as llama.cpp does it: when the cache is full, the first keep tokens stay,
// half of the rest is discarded, and the rows after the discarded ones move down into their
// place. A cached K row holds its token's key rotated by its position p; at its new row it
// must be rotated by p-n, and since RoPE's rotation is linear in the position, rotating the
// cached row by -n gives exactly that (up to rounding). V rows need no change. The rotation
// is a small graph over every layer's K rows: ROPE with delta positions, or for models with
// per-frequency factors the cos/sin tables of the delta; a quantized K is dequantized,
// rotated and quantized again (one more rounding, as llama.cpp's shift of a quantized cache).
//
// The shifted cache is not what a fresh prefill of the kept tokens would give (the moved
// tokens' keys and values of layers past the first were computed with the discarded tokens in
// view); that is the point: the model goes on with what it had read, at the cost of a
// recompute it skips.

// ErrNoShift: a context shift with these keep and discard counts would discard nothing.
var ErrNoShift = errors.New("llm: the context cannot be shifted")

// WithContextShift lets Generate go on past a full context as llama.cpp does (its --keep and
// llama-server's n_keep): the first keep tokens of the cache stay, plus BOS when the
// vocabulary adds one (a negative keep keeps the whole prompt), and half of the rest is
// discarded (Runner.ShiftContext), as often as the generation needs. Without it a full
// context ends generation with StopContext, as it does when the kept tokens leave nothing to
// discard. Speculative decoding shifts too; a prompt longer than the context is still an error.
func WithContextShift(keep int) GenerateOption {
	return func(c *genConfig) { c.shift = &keep }
}

// shiftKeep is the rows a context shift keeps for keep (WithContextShift) after a prompt of
// prompt tokens: llama.cpp's n_keep, which counts BOS on top and at most the prompt.
func (r *Runner) shiftKeep(keep, prompt int) int {
	if keep < 0 || keep > prompt {
		return prompt
	}
	if len(r.history) > 0 && r.history[0] == r.m.Tokenizer.BOS() && r.m.Tokenizer.Vocab().AddBOS {
		keep++
	}
	return min(keep, prompt)
}

// shiftFull makes room in a full cache keeping its first keep rows: llama.cpp's n_discard =
// (n_past - n_keep) / 2. ErrNoShift when that is nothing.
func (r *Runner) shiftFull(ctx context.Context, keep int) (int, error) {
	n := (r.pos - keep) / 2
	if n < 1 {
		return 0, fmt.Errorf("%w: %d tokens in the cache, %d kept: %w", ErrNoShift, r.pos, keep, ErrContextFull)
	}
	return n, r.shiftContext(ctx, keep, n)
}

// ShiftContext discards the n cache rows after the first keep, moves the rows after them down
// by n and rotates their keys back by n positions: the cache then holds Len()-n tokens, the
// kept ones first, and the next token fed goes after them, at position Len(). keep and n must
// lie in the cache and n be positive (else core.ErrInvalidArgument).
func (r *Runner) ShiftContext(ctx context.Context, keep, n int) error {
	ctx, leave, err := r.enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	return r.shiftContext(ctx, keep, n)
}

func (r *Runner) shiftContext(ctx context.Context, keep, n int) error {
	if r.closed {
		return fmt.Errorf("llm: runner is closed: %w", core.ErrBadState)
	}
	if keep < 0 || n < 1 || keep+n > r.pos {
		return fmt.Errorf("llm: shift discarding %d tokens after %d: the cache holds %d: %w", n, keep, r.pos, core.ErrInvalidArgument)
	}
	moved := r.pos - keep - n
	if moved > 0 {
		rows := make([]int, moved)
		for i := range rows {
			rows[i] = n + i
		}
		if err := r.compactKV(ctx, int64(keep), rows); err != nil {
			return err
		}
		if err := r.rotateK(ctx, keep, moved, n); err != nil {
			return err
		}
	}
	r.history = append(r.history[:keep], r.history[keep+n:]...)
	r.pos -= n
	r.cfg.logger.Debug("llm: context shifted", "kept", keep, "discarded", n, "moved", moved)
	return nil
}

// rotateK rotates the K rows [from, from+count) of every layer by -n positions, with the
// rotation prepared at the first shift; its nodes go where the plan puts the layer's decode
// nodes.
func (r *Runner) rotateK(ctx context.Context, from, count, n int) error {
	if r.shift == nil {
		ks := make([]sched.Span, len(r.kv))
		for l, kv := range r.kv {
			ks[l] = kv[0]
		}
		place := func(nd *core.Node) (int, int, error) {
			u, fb, err := r.plan.Place(sched.PhaseDecode, r.layerOf(1, nd), nd)
			if err != nil {
				return 0, 0, err
			}
			if fb >= 0 {
				fb = r.unitIdx[fb]
			}
			return r.unitIdx[u], fb, nil
		}
		sh, err := kvcache.NewShifter(ctx, r.rt, kvcache.ShifterSpec{Config: &r.m.Config, ContextLength: r.cfg.ctxLen,
			Rows: r.shiftRows(), K: r.cfg.kv.K, KCache: ks, Place: place})
		if err != nil {
			return fmt.Errorf("llm: %w", err)
		}
		r.shift = sh
	}
	return r.shift.Rotate(ctx, from, count, n)
}

// shiftRows is the block of rows the shift program rotates per chunk: the cache has that many
// rows past the context (Runner.cap), so a block starting inside the context stays inside it.
func (r *Runner) shiftRows() int64 { return r.cap - int64(r.cfg.ctxLen) + 1 }
