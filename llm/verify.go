package llm

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

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
	// Attach prepares one runner's verify programs with p, after the runner's own programs.
	// What it returns is the runner's Verifier.
	Attach(ctx context.Context, p *VerifyPrograms) (any, error)
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
	v, err := r.cfg.verifyHook.Attach(ctx, &VerifyPrograms{r: r, step: step})
	r.verify = v
	return err
}

// VerifyPrograms is what a VerifyHook prepares one runner's verify programs with, and keeps the
// rows of an accepted draft with.
type VerifyPrograms struct {
	r    *Runner
	step func()
}

// Logger is the runner's logger (WithLogger).
func (p *VerifyPrograms) Logger() *slog.Logger { return p.r.cfg.logger }

// Prepare compiles the stage programs of chunk length c, one of the hook's Lengths. With tree,
// each row attends to the cache before the chunk and to the rows of the chunk its mask row sets,
// at the position VerifyProgram.Run gives it (a draft tree's node sees its ancestors); a unit
// that refuses the mask fails with core.ErrUnsupported. Without, rows attend causally.
func (p *VerifyPrograms) Prepare(ctx context.Context, c int, tree bool) (*VerifyProgram, error) {
	r := p.r
	ctx, leave, err := r.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	if !slices.Contains(r.cfg.verify, c) {
		return nil, fmt.Errorf("llm: verify program of length %d: the hook's lengths are %v: %w", c, r.cfg.verify, core.ErrInvalidArgument)
	}
	t0 := time.Now()
	cp, err := r.prepare(ctx, int64(c), p.step, tree)
	if err != nil {
		return nil, err
	}
	r.vprogs = append(r.vprogs, cp)
	r.cfg.logger.Debug("llm: verify graphs prepared", "program", cp.prog.Name(), "took", time.Since(t0))
	return &VerifyProgram{r: r, cp: cp}, nil
}

// KeepRows keeps, of the cache rows from base on, those at keep (offsets from base, ascending
// from 0: a tree verify's accepted path), moved to rows base, base+1, ... on every unit
// (sched.Runtime.CompactKV), and drops the rest.
func (p *VerifyPrograms) KeepRows(ctx context.Context, base int, keep []int) error {
	r := p.r
	ctx, leave, err := r.enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	if base < 0 || len(keep) == 0 || keep[0] != 0 || base+keep[len(keep)-1] >= r.pos {
		return fmt.Errorf("llm: keep rows %v from %d: the cache holds %d: %w", keep, base, r.pos, core.ErrInvalidArgument)
	}
	if err := r.compactKV(ctx, int64(base), keep); err != nil {
		return err
	}
	for i, k := range keep {
		r.history[base+i] = r.history[base+k]
	}
	r.pos = base + len(keep)
	r.history = r.history[:r.pos]
	return nil
}

// VerifyProgram is one verify program (VerifyPrograms.Prepare).
type VerifyProgram struct {
	r  *Runner
	cp *chunkProg
}

// Len is the program's chunk length: the most tokens one Run takes.
func (p *VerifyProgram) Len() int { return int(p.cp.c) }

// Tree says the program takes a tree mask.
func (p *VerifyProgram) Tree() bool { return p.cp.tree }

// Close releases the program before the runner's Close does.
func (p *VerifyProgram) Close() error { return p.cp.prog.Close() }

// Run appends tokens, at most Len, to the cache in one pass and hands each the logits after
// every token (row i predicts the token after tokens[i]; F32 bytes, valid during the call
// only). A tree program takes each row's position as an offset from the cache's length (pos,
// Len of them) and the mask (Len × Len bytes, row i's ones the rows it attends to; a padding
// row should see itself); a causal one takes nil for both. More tokens than the context has
// room for is an error and changes nothing.
func (p *VerifyProgram) Run(ctx context.Context, tokens, pos []int32, mask []byte, each func(i int, row []byte) error) error {
	r, cp, c := p.r, p.cp, int(p.cp.c)
	ctx, leave, err := r.enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	if len(tokens) > c || cp.tree != (pos != nil) || pos != nil && (len(pos) != c || len(mask) != c*c) {
		return fmt.Errorf("llm: verify of %d tokens with %d positions and a mask of %d on the program of length %d (tree mask %v): %w",
			len(tokens), len(pos), len(mask), c, cp.tree, core.ErrInvalidArgument)
	}
	if pos != nil {
		a := r.rt.Arena()
		abs := make([]int32, c)
		for i, o := range pos {
			abs[i] = int32(r.pos) + o
		}
		copy(a.Bytes(cp.mask)[:c*c], mask)
		copy(a.Bytes(cp.pos), core.EncodeI32(abs))
		if r.m.Config.RopeFreqFactors != nil {
			cos, sin := r.m.Config.RopeTables(abs, r.cfg.ctxLen)
			copy(a.Bytes(cp.cos), core.EncodeF32(cos))
			copy(a.Bytes(cp.sin), core.EncodeF32(sin))
		}
	}
	_, err = r.feed(ctx, tokens, cp, each)
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
