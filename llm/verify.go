package llm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/draft"
)

// MaxVerifyLength bounds a verify length: a verify graph's logits are length × vocabulary
// floats, and drafts longer than this are not accepted whole in practice.
const MaxVerifyLength = 256

// DefaultVerifyLengths are the verify graphs a speculative runner prepares when none are given.
// 4 is there for the drafts that are likely but not sure to be kept: on a small model a
// verify of 4 costs about 1.3-1.5 decode passes against 2-2.4 for 8 (stories260K, neon), so
// a draft of 3 pays where one of 7 would not.
var DefaultVerifyLengths = []int{4, 8, 16, 32}

// WithVerifyLengths prepares, besides the prefill and decode graphs, one static-shape graph per
// length for verifying drafts (speculative decoding): Verify runs the shortest that holds its
// tokens, padded. Each length is between 2 and MaxVerifyLength and at most the context length;
// the cache gets room for the padding of the longest.
func WithVerifyLengths(lengths ...int) RunnerOption {
	return func(c *runnerConfig) { c.verify = slices.Clone(lengths) }
}

func checkVerifyLengths(ls []int, ctxLen int) error {
	for _, l := range ls {
		if l < 2 || l > MaxVerifyLength || l > ctxLen {
			return fmt.Errorf("llm: verify length %d: must be between 2 and %d and at most the context length %d: %w",
				l, MaxVerifyLength, ctxLen, core.ErrInvalidArgument)
		}
	}
	return nil
}

// programLengths are the chunk lengths of the prefill and decode graphs, ascending: decoding
// (1) and the prefill chunk.
func (r *Runner) programLengths() []int {
	if r.cfg.chunk == 1 {
		return []int{1}
	}
	return []int{1, r.cfg.chunk}
}

// prepareVerify prepares the verify graphs: with a tree mask where every unit takes it, else
// (a unit refuses the mask: the emulated NPU until it lowers it) for chains only.
func (r *Runner) prepareVerify(ctx context.Context, step func()) error {
	r.tree = true
	for _, n := range r.VerifyLengths() {
		t0 := time.Now()
		cp, err := r.prepare(ctx, int64(n), step, r.tree)
		if err != nil && r.tree && errors.Is(err, core.ErrUnsupported) {
			r.cfg.logger.Debug("llm: verify graphs without a tree mask", "err", err)
			r.tree = false
			for _, p := range r.vprogs {
				if err := p.prog.Close(); err != nil {
					return err
				}
			}
			clear(r.vprogs)
			return r.prepareChainVerify(ctx, step)
		}
		if err != nil {
			return err
		}
		r.vprogs[n] = cp
		r.cfg.logger.Debug("llm: verify graphs prepared", "program", cp.prog.Name(), "took", time.Since(t0))
	}
	return nil
}

// prepareChainVerify prepares verify graphs for chains (the causal mask).
func (r *Runner) prepareChainVerify(ctx context.Context, step func()) error {
	for _, n := range r.VerifyLengths() {
		cp, err := r.prepare(ctx, int64(n), step, false)
		if err != nil {
			return err
		}
		r.vprogs[n] = cp
	}
	return nil
}

// TreeVerify says the verify graphs take draft trees (VerifyTree); without, they take chains.
func (r *Runner) TreeVerify() bool { return r.tree && len(r.vprogs) > 0 }

// VerifyLengths are the verify graph lengths (WithVerifyLengths), ascending.
func (r *Runner) VerifyLengths() []int {
	ls := slices.Clone(r.cfg.verify)
	slices.Sort(ls)
	return slices.Compact(ls)
}

// MaxVerify is the most tokens one Verify takes: the longest verify length, 0 without any.
func (r *Runner) MaxVerify() int {
	if len(r.cfg.verify) == 0 {
		return 0
	}
	return slices.Max(r.cfg.verify)
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

// Verify appends tokens (the last accepted token and then a draft) in one pass of the shortest
// verify graph that holds them, and returns the logits after each of them: row i predicts the
// token after tokens[i]. The cache then holds every token given; Truncate drops a rejected
// draft's rows. More tokens than the longest verify length, or than the context has room for,
// is an error and changes nothing.
func (r *Runner) Verify(ctx context.Context, tokens []int32) ([][]float32, error) {
	ctx, leave, err := r.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	if len(tokens) == 0 {
		return nil, fmt.Errorf("llm: verify of no tokens: %w", core.ErrInvalidArgument)
	}
	if len(tokens) == 1 {
		l, err := r.Decode(ctx, tokens[0])
		if err != nil {
			return nil, err
		}
		return [][]float32{l}, nil
	}
	return r.VerifyTree(ctx, tokens[0], draft.Chain(tokens[1:]))
}

// VerifyTree appends root (the last accepted token) and the draft tree's nodes to the cache in
// one pass of the shortest verify graph that holds them, each node seeing its ancestors only
// (a tree mask) and placed at the position of its depth, and returns the logits after root (row
// 0) and after each node (row i+1). The cache then holds root and the nodes in tree order:
// KeepPath keeps an accepted path. A tree that is not a chain needs TreeVerify; an invalid
// tree, more nodes than the longest verify graph takes or than the context has room for is an
// error and changes nothing.
func (r *Runner) VerifyTree(ctx context.Context, root int32, tree draft.Tree) ([][]float32, error) {
	ctx, leave, err := r.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	return r.VerifyTreeInto(ctx, root, tree, nil)
}

// VerifyTreeInto is VerifyTree with the logits written into buf when it holds them (a
// speculative loop's rows live for one step: a fresh n × vocabulary slice per verify was a
// sixth of the Go side's time of a verify pass on a small model).
func (r *Runner) VerifyTreeInto(ctx context.Context, root int32, tree draft.Tree, buf []float32) ([][]float32, error) {
	ctx, leave, err := r.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	return r.verifyTree(ctx, root, tree, buf)
}

func (r *Runner) verifyTree(ctx context.Context, root int32, tree draft.Tree, buf []float32) ([][]float32, error) {
	n := tree.Len() + 1
	var cp *chunkProg
	for _, l := range r.VerifyLengths() {
		if l >= n {
			cp = r.vprogs[l]
			break
		}
	}
	if cp == nil {
		return nil, fmt.Errorf("llm: verify of %d tokens: the longest verify graph takes %d: %w",
			n, r.MaxVerify(), core.ErrInvalidArgument)
	}
	if err := tree.Validate(r.m.Config.Vocab, n-1); err != nil {
		return nil, fmt.Errorf("llm: %w: %w", err, core.ErrInvalidArgument)
	}
	chain := true
	for i, p := range tree.Parents {
		chain = chain && p == i-1
	}
	if !chain && !cp.tree {
		return nil, fmt.Errorf("llm: the verify graphs take chains only (a unit refuses the tree mask): %w", core.ErrUnsupported)
	}
	if r.pos+n > r.cfg.ctxLen {
		return nil, fmt.Errorf("%w: %d tokens in the cache + %d new > context length %d",
			ErrContextFull, r.pos, n, r.cfg.ctxLen)
	}
	if cp.tree {
		r.writeTreeInputs(cp, tree)
	}
	tokens := append([]int32{root}, tree.Tokens...)
	V := r.m.Config.Vocab
	flat := buf
	if len(flat) < n*V {
		flat = make([]float32, n*V)
	}
	out := make([][]float32, n)
	for i := range out {
		out[i] = flat[i*V : (i+1)*V]
	}
	_, err := r.feed(ctx, tokens, cp, func(i int, row []byte) error {
		core.DecodeF32To(out[i], row[:4*len(out[i])])
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// writeTreeInputs writes a tree verify's positions (root at the cache length, a node one past
// its parent) and mask (row i: its ancestors and itself; a padding row sees itself only).
func (r *Runner) writeTreeInputs(cp *chunkProg, tree draft.Tree) {
	c := int(cp.c)
	a := r.rt.Arena()
	pos := make([]int32, c)
	mask := a.Bytes(cp.mask)[:c*c]
	clear(mask)
	pos[0] = int32(r.pos)
	mask[0] = 1
	for i, p := range tree.Parents {
		row := i + 1
		pos[row] = pos[p+1] + 1
		copy(mask[row*c:row*c+c], mask[(p+1)*c:(p+1)*c+c])
		mask[row*c+row] = 1
	}
	for row := tree.Len() + 1; row < c; row++ {
		pos[row] = pos[0] + int32(row)
		mask[row*c+row] = 1
	}
	copy(a.Bytes(cp.pos), core.EncodeI32(pos))
	if r.m.Config.RopeFreqFactors != nil {
		cos, sin := r.m.Config.RopeTables(pos, r.cfg.ctxLen)
		copy(a.Bytes(cp.cos), core.EncodeF32(cos))
		copy(a.Bytes(cp.sin), core.EncodeF32(sin))
	}
}

// KeepPath keeps, of the rows a VerifyTree wrote from cache row base on, those at keep (tree
// rows, ascending from 0 = the root: an accepted path), moved to rows base, base+1, ... on
// every unit (sched.Runtime.CompactKV), and drops the rest.
func (r *Runner) KeepPath(ctx context.Context, base int, keep []int) error {
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
