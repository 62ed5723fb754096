package llm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/draft"
	"github.com/xpuhub/xpu/llm/spec"
)

// SpecOption configures speculative decoding (WithSpeculative).
type SpecOption func(*specConfig)

type specConfig struct {
	drafter draft.Drafter
	always  bool
	stats   *spec.Stats
}

// SpecAlways verifies every draft the drafter proposes, at the shortest verify length that
// holds it, instead of choosing by the measured acceptance and costs (which falls back to
// plain decoding where drafts do not pay).
func SpecAlways() SpecOption { return func(c *specConfig) { c.always = true } }

// WithSpeculative decodes speculatively: after each token, d proposes a draft of what follows,
// the runner verifies it in one pass of a verify graph (the runner needs WithVerifyLengths) and
// keeps the longest prefix the model agrees with plus the model's own next token. Greedy output
// is exactly plain decoding's; with sampling, a draft token x is kept with the probability p(x)
// the sampler gives it, and on rejection the token is drawn from p without x, renormalized (the
// speculative-sampling rule for a drafter that proposes one token with certainty), so every
// token has plain sampling's distribution. Each step verifies the draft length that the
// acceptance measured so far and the measured cost of each verify length predict to produce
// the most tokens per second, which is plain decoding when drafts do not hit (it then probes
// again now and then, less often each time a probe fails). Result.Spec reports the steps.
func WithSpeculative(d draft.Drafter, opts ...SpecOption) GenerateOption {
	return func(c *genConfig) {
		sc := &specConfig{drafter: d}
		for _, o := range opts {
			o(sc)
		}
		c.spec = sc
	}
}

// calibrateTop is how many candidates per prompt position calibration gets.
const calibrateTop = 4

// specPrefill prefills ids, handing a Calibrator drafter the prompt's all-position predictions.
func (r *Runner) specPrefill(ctx context.Context, sc *specConfig, ids []int32, st *spec.Stats) ([]float32, error) {
	cal, ok := sc.drafter.(draft.Calibrator)
	if cp := r.progs[r.cfg.chunk]; !ok || cp.sp != nil || cp.prog.Lanes() > 1 {
		// all-position logits run the chunks one at a time: a prefill pipelined over units
		// would lose more than calibration gains
		return r.Prefill(ctx, ids)
	}
	preds := make([][]draft.Candidate, len(ids))
	var spent time.Duration
	logits, err := r.PrefillEach(ctx, ids, func(i int, l []float32) error {
		t0 := time.Now()
		preds[i] = topCandidates(l[:min(len(l), r.m.Tokenizer.Size())], calibrateTop)
		spent += time.Since(t0)
		return nil
	})
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := safely(func() { cal.Calibrate(ids, preds) }); err != nil {
		// the drafter's later proposals are checked and guarded; its calibration is lost
		r.cfg.logger.Warn("llm: drafter calibration failed", "err", err)
		st.Fallback = err.Error()
	}
	st.Calibrate = spent + time.Since(t0)
	return logits, nil
}

// topCandidates are the k most likely tokens of logits with their softmax probabilities.
func topCandidates(logits []float32, k int) []draft.Candidate {
	if len(logits) == 0 {
		return nil
	}
	mx := logits[argmax(logits)]
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l - mx))
	}
	top := make([]draft.Candidate, 0, k+1)
	for i, l := range logits {
		if len(top) == k && l <= top[k-1].P {
			continue
		}
		c := draft.Candidate{ID: int32(i), P: l}
		j, _ := slices.BinarySearchFunc(top, c, func(a, b draft.Candidate) int {
			if a.P > b.P {
				return -1
			}
			return 1
		})
		top = slices.Insert(top, j, c)
		if len(top) > k {
			top = top[:k]
		}
	}
	for i := range top {
		top[i].P = float32(math.Exp(float64(top[i].P-mx)) / sum)
	}
	return top
}

// specDecode is Generate's decoding loop with drafts: logits are the prefill's, base the cache
// length after it.
func (r *Runner) specDecode(ctx context.Context, cfg *genConfig, res *Result, logits []float32, dec interface{ Next(int32) string },
	text *[]byte, st *spec.Stats) error {
	sc := cfg.spec
	tok := r.m.Tokenizer
	vs := min(len(logits), tok.Size())
	vocab := r.m.Config.Vocab
	base := r.pos
	sampler := NewSampler(cfg.sampler)
	greedy := cfg.sampler.Temperature <= 0
	pol := spec.NewPolicy(r.VerifyLengths(), sc.always)
	drafter := sc.drafter
	trace := r.rt.Trace()
	spentIn := time.Duration(0) // draft + verify + decode time, to derive the overhead
	loopStart := time.Now()
	defer func() {
		st.Overhead = time.Since(loopStart) - spentIn
		if st.Overhead < 0 {
			st.Overhead = 0
		}
	}()
	// emit is plain decoding's handling of a chosen token; true ends generation.
	emit := func(next int32) (bool, error) {
		if tok.IsStop(next) || (next == tok.BOS() && next >= 0) {
			res.Stop = StopEOS
			return true, nil
		}
		res.Tokens = append(res.Tokens, next)
		if cfg.onToken != nil {
			if err := cfg.onToken(next); err != nil {
				return true, err
			}
		}
		if piece := dec.Next(next); piece != "" {
			*text = append(*text, piece...)
			if cfg.stream != nil {
				if err := cfg.stream(piece); err != nil {
					return true, err
				}
			}
		}
		if len(res.Tokens) >= cfg.maxTokens {
			res.Stop = StopMaxTokens
			return true, nil
		}
		// plain decoding has fed every emitted token but this one (with a context shift, the
		// loop makes room before it feeds it)
		if base+len(res.Tokens)-1 >= r.cfg.ctxLen && cfg.shift == nil {
			res.Stop = StopContext
			return true, nil
		}
		return false, nil
	}
	// the cache ends as plain decoding leaves it: every emitted token fed but the last, unless
	// generation ended at a stop token (WithKeepCache continues from there)
	defer func() {
		want := base + len(res.Tokens) - 1
		if res.Stop == StopEOS {
			want++
		}
		if want >= 0 && want < r.pos {
			_ = r.Truncate(want)
		}
	}()
	buf := make([]float32, vs)
	rowsBuf := make([]float32, r.MaxVerify()*vocab) // a verify's logits, reused by every step
	sample := func(l []float32, hist []int32) int32 {
		copy(buf, l[:vs])
		return sampler.Sample(buf, hist)
	}
	// predict is the greedy choice from a row of logits; without a repeat penalty it reads the
	// row in place (a verify predicts every kept row: copying a 32K vocabulary each time costs
	// more than the argmax)
	predict := func(l []float32, hist []int32) int32 {
		if !sampler.penalizes() {
			return argmax(l[:vs])
		}
		copy(buf, l[:vs])
		sampler.penalize(buf, hist)
		return argmax(buf)
	}
	kidsBuf := make([][]int, r.MaxVerify()+1) // a verify's children by parent row, reused
	// the sequence a drafter sees and a verify's history: copies of the cache's tokens plus the
	// step's own, in buffers every step reuses (a fresh copy of a 600-token history each step
	// was most of the loop's allocations)
	var seqBuf, histBuf []int32
	next := sample(logits, r.history)
	for {
		if stop, err := emit(next); stop || err != nil {
			return err
		}
		if cfg.shift != nil && r.pos >= r.cfg.ctxLen {
			n, err := r.shiftFull(ctx, cfg.keepRows)
			if errors.Is(err, ErrNoShift) {
				res.Stop = StopContext
				return nil
			}
			if err != nil {
				return err
			}
			base -= n
		}
		var tree draft.Tree
		budget := min(r.MaxVerify()-1, r.cfg.ctxLen-r.pos-1, cfg.maxTokens-len(res.Tokens))
		if drafter != nil && budget > 0 && pol.WorthDrafting(budget) {
			t0 := time.Now()
			seqBuf = append(append(seqBuf[:0], r.history...), next)
			seq := seqBuf
			var err error
			tree, err = proposeSafely(drafter, seq, budget)
			if err == nil {
				err = tree.Validate(vocab, budget)
			}
			d := time.Since(t0)
			st.Draft += d
			spentIn += d
			if err != nil {
				// a broken drafter costs speed, never text: decode plainly from here on
				r.cfg.logger.Warn("llm: speculative decoding off: the drafter failed", "err", err)
				st.Fallback = err.Error()
				drafter, tree = nil, draft.Tree{}
			} else if !r.TreeVerify() {
				tree = draft.Chain(tree.Primary())
			}
		}
		k, l := pol.Choose(tree.Len(), tree.Match)
		tree = tree.Prefix(k)
		t0 := time.Now()
		if k == 0 {
			var err error
			if logits, err = r.Decode(ctx, next); err != nil {
				return err
			}
			d := time.Since(t0)
			st.Decode += d
			spentIn += d
			st.Passes++
			st.Plain++
			pol.Observe(1, d, 0, 0, 0)
			if err := checkLogits(logits, r.pos-1); err != nil {
				return err
			}
			next = sample(logits, r.history)
			continue
		}
		base := r.pos // the row of next
		rows, err := r.verifyTree(ctx, next, tree, rowsBuf)
		if err != nil {
			return err
		}
		d := time.Since(t0)
		st.Verify += d
		spentIn += d
		// walk the tree from the root: each step keeps the child the model picks
		kids := kidsBuf[:k+1] // by parent row (0: the root)
		for i := range kids {
			kids[i] = kids[i][:0]
		}
		for i, p := range tree.Parents {
			kids[p+1] = append(kids[p+1], i)
		}
		histBuf = append(histBuf[:0], r.history[:base+1]...)
		hist := histBuf
		keep := []int{0}
		cur := -1 // the node whose row predicts next (-1: the root)
		var corr int32
		// the model's predictions at the kept rows, for the drafter: greedy, the walk's own
		preds := make([]int32, 0, k+1)
		for {
			row := rows[cur+1]
			if err := checkLogits(row, base+len(keep)-1); err != nil {
				return err
			}
			var child int
			if greedy {
				pred := predict(row, hist)
				child = -1
				for _, c := range kids[cur+1] {
					if tree.Tokens[c] == pred {
						child = c
						break
					}
				}
				corr = pred
				preds = append(preds, pred)
			} else {
				copy(buf, row[:vs])
				sampler.penalize(buf, hist)
				child, corr = acceptTree(sampler, sampler.dist(buf), tree.Tokens, kids[cur+1])
			}
			if child < 0 {
				break
			}
			cur = child
			keep = append(keep, child+1)
			hist = append(hist, tree.Tokens[child])
		}
		histBuf = hist // grown by the walk: the next step reuses the larger buffer
		a := len(keep) - 1
		// what the drafter learns: the path verified, the accepted nodes and then the first
		// child's line below the last, with the model's predictions along it
		stepDraft := slices.Clone(hist[base+1:])
		if !greedy {
			for _, row := range keep {
				preds = append(preds, predict(rows[row], hist[:base+len(preds)+1]))
			}
		}
		for c := cur; len(kids[c+1]) > 0; {
			c = kids[c+1][0]
			stepDraft = append(stepDraft, tree.Tokens[c])
			var h []int32 // what a repeat penalty sees: the rejected line's tokens after the kept ones
			if sampler.penalizes() {
				h = append(r.history[:base+1:base+1], stepDraft...)
			}
			preds = append(preds, predict(rows[c+1], h))
		}
		if err := r.KeepPath(ctx, base, keep); err != nil {
			return err
		}
		st.Passes++
		st.Verifies++
		st.Drafted += k
		st.Accepted += a
		if st.Lengths == nil {
			st.Lengths = map[int]int{}
		}
		st.Lengths[l]++
		for len(st.Histogram) <= a {
			st.Histogram = append(st.Histogram, 0)
		}
		st.Histogram[a]++
		pol.Observe(l, d, pathDepth(tree), a, tree.Match)
		if trace != nil { // its name and arguments are allocations every step
			trace.Slice("speculative", fmt.Sprintf("verify %d", l), t0, t0.Add(d),
				map[string]any{"row": base, "drafted": k, "accepted": a})
		}
		if drafter != nil {
			if err := safely(func() { drafter.Observe(draft.Step{Draft: stepDraft, Accepted: a, Predictions: preds}) }); err != nil {
				r.cfg.logger.Warn("llm: speculative decoding off: the drafter failed", "err", err)
				st.Fallback, drafter = err.Error(), nil
			}
		}
		for _, t := range hist[base+1:] {
			if stop, err := emit(t); stop || err != nil {
				return err
			}
		}
		next = corr
	}
}

// acceptTree is the speculative-sampling rule for draft children proposed with certainty
// (tokens[c] for c in kids, in order): child c is kept with the probability the distribution
// left so far gives its token; on rejection that token's probability goes and the rest is
// renormalized; when every child is rejected, the next token is drawn from what is left. Each
// token thus has probability p(token), as plain sampling gives. It returns the child kept (-1:
// none) and the token drawn (the kept child's when one is).
func acceptTree(s *Sampler, dist []cand, tokens []int32, kids []int) (int, int32) {
	rest := slices.Clone(dist)
	for _, c := range kids {
		x := tokens[c]
		px := 0.0
		for _, d := range rest {
			if d.id == x {
				px = d.p
			}
		}
		if px <= 0 {
			continue // not in the distribution, or rejected already
		}
		if s.rng.Float64() < px {
			return c, x
		}
		if px >= 1 {
			return c, x // rounding: nothing else is left
		}
		kept := rest[:0]
		for _, d := range rest {
			if d.id != x {
				kept = append(kept, cand{d.id, d.p / (1 - px)})
			}
		}
		rest = kept
	}
	return -1, s.draw(rest)
}

// pathDepth is the depth of a tree's first-child line, the draft positions the policy's
// acceptance statistics count.
func pathDepth(t draft.Tree) int { return len(t.Primary()) }

// proposeSafely calls a drafter, turning a panic into an error: drafters may be the caller's.
func proposeSafely(d draft.Drafter, history []int32, budget int) (t draft.Tree, err error) {
	err = safely(func() { t = d.Propose(history, budget) })
	return t, err
}

// safely runs a drafter's method, turning a panic into an error wrapping core.ErrInternal.
func safely(f func()) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("llm: drafter panicked: %v: %w", p, core.ErrInternal)
		}
	}()
	f()
	return nil
}

// ErrNoVerifyGraphs: speculative decoding was asked of a runner without verify graphs.
var ErrNoVerifyGraphs = errors.New("llm: the runner has no verify graphs (NewRunner with WithVerifyLengths)")
