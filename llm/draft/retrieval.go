package draft

import (
	"slices"
)

// RetrievalOptions tune a Retrieval drafter; the zero value takes the defaults.
type RetrievalOptions struct {
	// History, if set, is the task's store of earlier answers: indexed at the start and added
	// to by Finish.
	History *History
	// MaxQuery bounds the suffix looked up (default 32 tokens).
	MaxQuery int
	// CalibrateTopK is how many of the model's most likely tokens per prompt position in-context
	// calibration expands (default 3; negative: no calibration), CalibrateMinP the least
	// probability of one (default 0.1), CalibrateDepth how many predicted tokens a calibrated
	// sequence holds at most (default 12), CalibrateBudget the most tokens all of them hold
	// (default 8 per prompt token: on bench/spec.sh's summary task 64 took 18 ms of index
	// building for a 433-token prompt, a third of its prefill, and drafted no better than 4-8).
	CalibrateTopK   int
	CalibrateMinP   float32
	CalibrateDepth  int
	CalibrateBudget int
	// NoReuse turns off draft reuse; ReuseLife is how many steps a kept segment is offered
	// (default 2).
	NoReuse   bool
	ReuseLife int
}

// Retrieval is CoordGen's retrieval drafter: suffix-automaton indexes over the current sequence
// (grown as tokens are accepted), the task's earlier answers (History) and the model's own
// wording of the prompt (in-context calibration: sequences built from the prefill's
// all-position predictions), plus draft reuse (the model-agreeing part of a rejected draft is
// offered again in the next steps). The candidates of every source go into one tree, the
// longest suffix match first.
type Retrieval struct {
	opt   RetrievalOptions
	ctx   *Index
	seen  []int32 // what ctx indexes
	hist  *Index
	calib *Index
	reuse []segment
}

// segment is a kept part of a rejected draft.
type segment struct {
	tokens []int32
	life   int
}

// NewRetrieval returns a retrieval drafter.
func NewRetrieval(opt RetrievalOptions) *Retrieval {
	if opt.MaxQuery <= 0 {
		opt.MaxQuery = 32
	}
	if opt.CalibrateTopK == 0 {
		opt.CalibrateTopK = 3
	}
	if opt.CalibrateMinP <= 0 {
		opt.CalibrateMinP = 0.1
	}
	if opt.CalibrateDepth <= 0 {
		opt.CalibrateDepth = 12
	}
	if opt.ReuseLife <= 0 {
		opt.ReuseLife = 2
	}
	r := &Retrieval{opt: opt, ctx: NewIndex(), hist: NewIndex(), calib: NewIndex()}
	if opt.History != nil {
		for _, a := range opt.History.Answers() {
			r.hist.AddDoc(a)
		}
	}
	return r
}

// sync makes the context index hold history: appended to when history extends what it holds,
// rebuilt otherwise (a new sequence).
func (r *Retrieval) sync(history []int32) {
	if len(history) < len(r.seen) || !slices.Equal(history[:len(r.seen)], r.seen) {
		r.ctx, r.seen, r.reuse = NewIndex(), r.seen[:0], nil
	}
	for _, t := range history[len(r.seen):] {
		r.ctx.Append(t)
	}
	r.seen = append(r.seen, history[len(r.seen):]...)
}

// candidate is one source's proposal.
type candidate struct {
	score  float64
	match  int // tokens of the history its source matched
	tokens []int32
}

// Propose implements Drafter.
func (r *Retrieval) Propose(history []int32, budget int) Tree {
	r.sync(history)
	if budget <= 0 || len(history) == 0 {
		return Tree{}
	}
	q := history[max(0, len(history)-r.opt.MaxQuery):]
	var cands []candidate
	// ties: the model's own wording first, then the sequence, then earlier answers
	for i, x := range []*Index{r.calib, r.ctx, r.hist} {
		if l, cont := x.Lookup(q, budget); l > 0 && len(cont) > 0 {
			cands = append(cands, candidate{score: float64(l) - float64(i)/4, match: l, tokens: cont})
		}
	}
	for _, s := range r.reuse {
		// a segment whose start the sequence already ends with goes on from there
		o := overlap(history, s.tokens)
		if o < len(s.tokens) {
			cands = append(cands, candidate{score: float64(o) + 0.5, match: o, tokens: s.tokens[o:]})
		}
	}
	slices.SortStableFunc(cands, func(a, b candidate) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return 0
	})
	var t Tree
	for _, c := range cands {
		t.insert(c.tokens, budget)
	}
	if len(cands) > 0 {
		t.Match = cands[0].match
	}
	return t
}

// insert merges a sequence into the tree from the root, within budget nodes.
func (t *Tree) insert(seq []int32, budget int) {
	cur := -1
	for _, tok := range seq {
		next := -1
		for i := cur + 1; i < len(t.Tokens); i++ {
			if t.Parents[i] == cur && t.Tokens[i] == tok {
				next = i
				break
			}
		}
		if next < 0 {
			if len(t.Tokens) >= budget {
				return
			}
			t.Tokens, t.Parents = append(t.Tokens, tok), append(t.Parents, cur)
			next = len(t.Tokens) - 1
		}
		cur = next
	}
}

// overlap is the longest o < len(seg) such that history ends with seg[:o].
func overlap(history, seg []int32) int {
	for o := min(len(seg)-1, len(history)); o > 0; o-- {
		if slices.Equal(history[len(history)-o:], seg[:o]) {
			return o
		}
	}
	return 0
}

// Observe implements Drafter: it ages the kept segments and keeps the longest model-agreeing
// segment of a rejected draft (CoordGen's draft reuse): Draft[j..k] with the model predicting
// each of Draft[j+1..k] after the one before, which often follows once the model has produced
// the tokens it inserted or the synonym it chose.
func (r *Retrieval) Observe(s Step) {
	if r.opt.NoReuse {
		return
	}
	live := r.reuse[:0]
	for _, seg := range r.reuse {
		if seg.life--; seg.life > 0 {
			live = append(live, seg)
		}
	}
	r.reuse = live
	m := s.Accepted
	if m >= len(s.Draft) || len(s.Predictions) != len(s.Draft)+1 {
		return
	}
	bestJ, bestK := -1, -1
	for j := m; j < len(s.Draft); {
		k := j
		for k+1 < len(s.Draft) && s.Predictions[k+1] == s.Draft[k+1] {
			k++
		}
		if k-j > bestK-bestJ {
			bestJ, bestK = j, k
		}
		j = k + 1
	}
	if bestK-bestJ >= 1 {
		r.reuse = append(r.reuse, segment{tokens: slices.Clone(s.Draft[bestJ : bestK+1]), life: r.opt.ReuseLife})
	}
}

// Calibrate implements Calibrator: in-context distribution calibration (CoordGen §3.3). Where
// the model would continue a prompt position with a token the prompt does not have there, the
// prompt's few tokens before it, that token and what the model predicts after it become a
// sequence of the calibration index. What follows a predicted token t is read from the
// predictions at t's occurrences in the prompt (the model's distribution given the prompt, an
// approximation of its distribution after the new path); it is expanded depth-first, each
// branch a sequence, within a token budget. A prompt that starts a sequence (or extends the one
// indexed) also goes into the context index here, with the prefill, instead of at the first
// proposal.
func (r *Retrieval) Calibrate(prompt []int32, preds [][]Candidate) {
	if len(r.seen) == 0 || (len(prompt) >= len(r.seen) && slices.Equal(prompt[:len(r.seen)], r.seen)) {
		r.sync(prompt) // a continued conversation's new turn alone would rebuild the index
	}
	o := r.opt
	if o.CalibrateTopK < 0 || len(preds) != len(prompt) {
		return
	}
	budget := o.CalibrateBudget
	if budget <= 0 {
		budget = 8 * len(prompt)
	}
	occ := map[int32][]int{}
	for i, t := range prompt {
		occ[t] = append(occ[t], i)
	}
	top := func(p int) []int32 {
		var out []int32
		for _, c := range preds[p] {
			if len(out) == o.CalibrateTopK {
				break
			}
			if c.P >= o.CalibrateMinP {
				out = append(out, c.ID)
			}
		}
		return out
	}
	// at is where t's successors are read: its first occurrence after p, else its last.
	at := func(t int32, p int) int {
		os := occ[t]
		if len(os) == 0 {
			return -1
		}
		i, _ := slices.BinarySearch(os, p+1)
		if i < len(os) {
			return os[i]
		}
		return os[len(os)-1]
	}
	const window = 4
	var dfs func(path []int32, p, depth int)
	dfs = func(path []int32, p, depth int) {
		if budget <= 0 {
			return
		}
		var next []int32
		if p >= 0 && depth < o.CalibrateDepth {
			next = top(p)
		}
		if len(next) == 0 {
			r.calib.AddDoc(path)
			budget -= len(path)
			return
		}
		for _, t := range next {
			q := p + 1
			if q >= len(prompt) || prompt[q] != t {
				q = at(t, p)
			}
			dfs(append(path[:len(path):len(path)], t), q, depth+1)
		}
	}
	for p := 0; p+1 < len(prompt) && budget > 0; p++ {
		for _, t := range top(p) {
			if t == prompt[p+1] {
				continue // the prompt's own wording: the context index has it
			}
			path := slices.Clone(prompt[max(0, p+1-window) : p+1])
			dfs(append(path, t), at(t, p), 1)
		}
	}
	// the prediction after the prompt's last token starts the answer
	if n := len(prompt); n > 0 && budget > 0 {
		for _, t := range top(n - 1) {
			dfs(append(slices.Clone(prompt[max(0, n-window):]), t), at(t, n-1), 1)
		}
	}
}

// Finish implements Finisher: the answer goes to the history store and, for a next generation
// with this drafter, to the history index.
func (r *Retrieval) Finish(answer []int32) error {
	if len(answer) == 0 {
		return nil
	}
	r.hist.AddDoc(answer)
	if r.opt.History == nil {
		return nil
	}
	return r.opt.History.Add(answer)
}
