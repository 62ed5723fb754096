package spec

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/draft"
)

// Option configures speculative decoding (With).
type Option func(*config)

type config struct {
	drafter draft.Drafter
	always  bool
}

// Always verifies every draft the drafter proposes, at the shortest verify length that holds
// it, instead of choosing by the measured acceptance and costs (which falls back to plain
// decoding where drafts do not pay).
func Always() Option { return func(c *config) { c.always = true } }

// With decodes speculatively (an llm.Strategy): after each token, d proposes a draft of what
// follows, the runner verifies it in one pass of a verify graph (the runner needs
// WithVerifyLengths) and keeps the longest prefix the model agrees with plus the model's
// own next token. Greedy output is exactly plain decoding's; with sampling, a draft token x is
// kept with the probability p(x) the sampler gives it, and on rejection the token is drawn from
// p without x, renormalized (the speculative-sampling rule for a drafter that proposes one
// token with certainty), so every token has plain sampling's distribution. Each step verifies
// the draft length that the acceptance measured so far and the measured cost of each verify
// length predict to produce the most tokens per second, which is plain decoding when drafts do
// not hit (it then probes again now and then, less often each time a probe fails). StatsOf
// reports the steps. A nil d decodes plainly, with the statistics.
func With(d draft.Drafter, opts ...Option) llm.GenerateOption {
	s := &strategy{config{drafter: d}}
	for _, o := range opts {
		o(&s.config)
	}
	return llm.WithStrategy(s)
}

// StatsOf is the speculative statistics of a generation decoded With a drafter, nil for
// another.
func StatsOf(res llm.Result) *Stats {
	st, _ := res.Strategy.(*Stats)
	return st
}

// ErrNoVerifyGraphs: speculative decoding was asked of a runner without verify graphs.
var ErrNoVerifyGraphs = errors.New("spec: the runner has no verify graphs (spec.WithVerifyLengths)")

// strategy is speculative decoding as an llm.Strategy; it keeps nothing of a generation but
// its configuration (the statistics are the generation's report).
type strategy struct{ config }

// calibrateTop is how many candidates per prompt position calibration gets.
const calibrateTop = 4

// Begin implements llm.Strategy.
func (s *strategy) Begin(g *llm.Generation) error {
	if s.drafter != nil && MaxVerify(g.Runner()) == 0 {
		return fmt.Errorf("%w: %w", ErrNoVerifyGraphs, core.ErrInvalidArgument)
	}
	g.SetReport(&Stats{})
	return nil
}

// Prefill implements llm.Strategy: it prefills ids, handing a Calibrator drafter the prompt's
// all-position predictions.
func (s *strategy) Prefill(ctx context.Context, g *llm.Generation, ids []int32) ([]float32, error) {
	r := g.Runner()
	cal, ok := s.drafter.(draft.Calibrator)
	if !ok || r.PrefillEachLoses() {
		// all-position logits run the chunks one at a time: a prefill pipelined over units
		// would lose more than calibration gains
		return r.Prefill(ctx, ids)
	}
	st := g.Report().(*Stats)
	size := r.Model().Tokenizer.Size()
	preds := make([][]draft.Candidate, len(ids))
	var spent time.Duration
	logits, err := r.PrefillEach(ctx, ids, func(i int, l []float32) error {
		t0 := time.Now()
		preds[i] = TopCandidates(l[:min(len(l), size)], calibrateTop)
		spent += time.Since(t0)
		return nil
	})
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := safely(func() { cal.Calibrate(ids, preds) }); err != nil {
		// the drafter's later proposals are checked and guarded; its calibration is lost
		g.Logger().Warn("spec: drafter calibration failed", "err", err)
		st.Fallback = err.Error()
	}
	st.Calibrate = spent + time.Since(t0)
	return logits, nil
}

// Finish implements llm.Strategy: a Finisher drafter stores the answer for later drafts.
func (s *strategy) Finish(g *llm.Generation, res llm.Result) {
	f, ok := s.drafter.(draft.Finisher)
	if !ok {
		return
	}
	var ferr error
	if perr := safely(func() { ferr = f.Finish(res.Tokens) }); perr != nil {
		ferr = perr
	}
	if ferr != nil {
		// the answer is good; only a later request's drafts lose it
		g.Logger().Warn("spec: storing the answer for later drafts", "err", ferr)
	}
}

// Decode implements llm.Strategy: Generate's decoding loop with drafts, from the prompt's
// logits.
func (s *strategy) Decode(ctx context.Context, g *llm.Generation, logits []float32) error {
	st := g.Report().(*Stats)
	r := g.Runner()
	m := r.Model()
	vs := min(len(logits), m.Tokenizer.Size())
	vocab := m.Config.Vocab
	ctxLen := r.ContextLength()
	base := r.Len()
	sampler := g.Sampler()
	greedy := g.Greedy()
	pol := NewPolicy(VerifyLengths(r), s.always)
	drafter := s.drafter
	trace := r.Trace()
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
		if done, err := g.Emit(next); done || err != nil {
			return true, err
		}
		// plain decoding has fed every emitted token but this one (with a context shift, the
		// loop makes room before it feeds it)
		if base+len(g.Tokens())-1 >= ctxLen && !g.Shifts() {
			g.Stop(llm.StopContext)
			return true, nil
		}
		return false, nil
	}
	// the cache ends as plain decoding leaves it: every emitted token fed but the last, unless
	// generation ended at a stop token (WithKeepCache continues from there)
	defer func() {
		want := base + len(g.Tokens()) - 1
		if g.Stopped() == llm.StopEOS {
			want++
		}
		if want >= 0 && want < r.Len() {
			_ = r.Truncate(want)
		}
	}()
	buf := make([]float32, vs)
	rowsBuf := make([]float32, MaxVerify(r)*vocab) // a verify's logits, reused by every step
	// the cache's tokens, the sequence a drafter sees and a verify's history: copies in
	// buffers every step reuses (a fresh copy of a 600-token history each step was most of
	// the loop's allocations)
	var cacheBuf, seqBuf, histBuf []int32
	sample := func(l []float32) int32 {
		copy(buf, l[:vs])
		cacheBuf = r.AppendTokens(cacheBuf[:0])
		return sampler.Sample(buf, cacheBuf)
	}
	kidsBuf := make([][]int, MaxVerify(r)+1) // a verify's children by parent row, reused
	next := sample(logits)
	for {
		if stop, err := emit(next); stop || err != nil {
			return err
		}
		if g.Shifts() && r.Len() >= ctxLen {
			n, err := g.Shift(ctx)
			if errors.Is(err, llm.ErrNoShift) {
				g.Stop(llm.StopContext)
				return nil
			}
			if err != nil {
				return err
			}
			base -= n
		}
		var tree draft.Tree
		budget := min(MaxVerify(r)-1, ctxLen-r.Len()-1, g.Remaining())
		if drafter != nil && budget > 0 && pol.WorthDrafting(budget) {
			t0 := time.Now()
			seqBuf = append(r.AppendTokens(seqBuf[:0]), next)
			var err error
			tree, err = proposeSafely(drafter, seqBuf, budget)
			if err == nil {
				err = tree.Validate(vocab, budget)
			}
			d := time.Since(t0)
			st.Draft += d
			spentIn += d
			if err != nil {
				// a broken drafter costs speed, never text: decode plainly from here on
				g.Logger().Warn("spec: speculative decoding off: the drafter failed", "err", err)
				st.Fallback = err.Error()
				drafter, tree = nil, draft.Tree{}
			} else if !TreeVerify(r) {
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
			if err := llm.CheckLogits(logits, r.Len()-1); err != nil {
				return err
			}
			next = sample(logits)
			continue
		}
		base := r.Len() // the row of next
		rows, err := VerifyTreeInto(ctx, r, next, tree, rowsBuf)
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
		histBuf = r.AppendTokens(histBuf[:0])[:base+1]
		hist := histBuf
		keep := []int{0}
		cur := -1 // the node whose row predicts next (-1: the root)
		var corr int32
		// the model's predictions at the kept rows, for the drafter: greedy, the walk's own
		preds := make([]int32, 0, k+1)
		for {
			row := rows[cur+1]
			if err := llm.CheckLogits(row, base+len(keep)-1); err != nil {
				return err
			}
			var child int
			if greedy {
				pred := sampler.Predict(row[:vs], hist)
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
				child, corr = sampler.AcceptDraft(row[:vs], hist, tree.Tokens, kids[cur+1])
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
				preds = append(preds, sampler.Predict(rows[row][:vs], hist[:base+len(preds)+1]))
			}
		}
		for c := cur; len(kids[c+1]) > 0; {
			c = kids[c+1][0]
			stepDraft = append(stepDraft, tree.Tokens[c])
			var h []int32 // what a repeat penalty sees: the rejected line's tokens after the kept ones
			if sampler.Penalizes() {
				h = append(hist[:base+1:base+1], stepDraft...)
			}
			preds = append(preds, sampler.Predict(rows[c+1][:vs], h))
		}
		if err := KeepPath(ctx, r, base, keep); err != nil {
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
				g.Logger().Warn("spec: speculative decoding off: the drafter failed", "err", err)
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
			err = fmt.Errorf("spec: drafter panicked: %v: %w", p, core.ErrInternal)
		}
	}()
	f()
	return nil
}
