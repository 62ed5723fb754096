// Package spec decodes speculatively (With: a decode strategy of llm.Generate that drafts,
// verifies in one pass and keeps what the model agrees with), over the verify graphs it prepares
// on a runner (WithVerifyLengths, an llm.VerifyHook; Verify, VerifyTree and KeepPath), with the
// policy that picks each step's draft length (expected accepted tokens per second of its verify
// graph), the candidates drafters are calibrated with, and the statistics a speculative
// generation reports.
package spec

import (
	"math"
	"slices"
	"time"
)

// Policy picks each step's draft length: the one whose expected tokens (from the
// acceptance measured so far, per draft position and per match length of the draft's source)
// per second of its verify graph (measured) is highest, plain decoding included.
type Policy struct {
	lengths []int           // verify lengths, ascending
	cost    map[int]float64 // moving minima: seconds per decode (1); a verify length's passes in decodes (ratio)
	// tried[b][i]: decayed count of verifies of match bucket b (matchBuckets) that reached draft
	// position i; hit[b][i]: of those, the ones that accepted it. Bucket 0 pools every verify.
	tried, hit [][]float64
	always     bool
	skipped    int         // plain steps since the last verify although a draft was there
	probe      int         // verify after this many skipped steps (4× after each probe that did not pay)
	runs       map[int]int // passes observed per length
}

const (
	probeFirst = 64
	margin     = 1.15
	probeMax   = 2048
	// decay weighs recent steps more: the text may move from copying to new writing.
	decay = 0.95
	// matchBuckets: the pool, then draft.Tree.Match 0 (not said), 1, 2, 3-4, 5-8, 9-15, 16
	// and more
	matchBuckets = 8
)

// matchBucket is the statistics bucket of a draft whose source matched m tokens.
func matchBucket(m int) int {
	switch {
	case m <= 0:
		return 1
	case m <= 2:
		return 1 + m
	case m <= 4:
		return 4
	case m <= 8:
		return 5
	case m <= 15:
		return 6
	}
	return 7
}

// NewPolicy is a policy over the runner's verify lengths (ascending); always verifies every
// draft, whatever it is expected to pay.
func NewPolicy(lengths []int, always bool) *Policy {
	maxL := 0
	if len(lengths) > 0 {
		maxL = slices.Max(lengths)
	}
	p := &Policy{lengths: lengths, cost: map[int]float64{}, runs: map[int]int{}, tried: make([][]float64, matchBuckets),
		hit: make([][]float64, matchBuckets), always: always, probe: probeFirst}
	for b := range p.tried {
		p.tried[b], p.hit[b] = make([]float64, maxL), make([]float64, maxL)
	}
	return p
}

// fittedMatchPriors are the acceptance a draft position is given, by match bucket, before its
// bucket has verifies of its own (0: take the pool's estimate): a source that matched more of
// the sequence's last tokens is copying text, and is followed far more often. They are FITTED,
// not derived: rounded from the acceptance counts of one task (bench/spec.sh's summary task on
// stories260K, retrieval drafts verified always), recorded in
// the lab notes on speculative decoding ("match priors"); another model or task would
// fit other values. Without them every bucket started from the pool, which the many
// short-match drafts pull down early: the long-match drafts, the ones that pay, were then
// never verified at all.
var fittedMatchPriors = [matchBuckets]float64{0, 0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9}

// accept is the estimated probability that draft position i (0-based) of a draft in match
// bucket b is accepted given that the positions before it were: the bucket's own counts,
// shrunk toward its prior (fittedMatchPriors, else the pool's estimate, which starts from 1/2) while
// the bucket has few verifies, so that a bucket is neither trusted on one pass nor left
// unmeasured.
func (p *Policy) accept(b, i int) float64 {
	prior := (p.hit[0][i] + 0.5) / (p.tried[0][i] + 1)
	if b == 0 {
		return prior
	}
	if fittedMatchPriors[b] > 0 {
		prior = fittedMatchPriors[b]
	}
	return (p.hit[b][i] + 2*prior) / (p.tried[b][i] + 2)
}

// WorthDrafting says whether a draft of k tokens could be verified this step: a verify would
// pay if all k came, or a probe is due, or the costs are not measured yet. When it is not,
// the step is counted as skipped (toward the next probe) and drafting is saved.
func (p *Policy) WorthDrafting(k int) bool {
	if p.always || len(p.lengths) == 0 {
		return true
	}
	c1, ok := p.cost[1]
	if !ok {
		return true
	}
	if p.skipped+1 >= p.probe {
		return true
	}
	for _, l := range p.lengths {
		kk := min(k, l-1)
		c := p.ratio(l) * c1
		for b := range matchBuckets {
			if p.expected(kk, b)/c > margin/c1 {
				return true
			}
		}
	}
	p.skipped++
	return false
}

// expected is the tokens a pass is expected to produce from a draft of k tokens in match
// bucket b: the correction plus the chance of each draft position being reached and accepted.
func (p *Policy) expected(k, b int) float64 {
	exp, run, last := 1.0, 1.0, 0.5
	for i := range k {
		// a position no recent verify reached is taken to go as the deepest one that did,
		// unless the bucket has a prior of its own
		c := last
		if p.tried[0][i] >= 1 || fittedMatchPriors[b] > 0 {
			c = p.accept(b, i)
			last = c
		}
		run *= c
		exp += run
	}
	return exp
}

// Choose is how many of k draft tokens, whose source matched match tokens, to verify (0:
// decode plainly), and the verify length.
func (p *Policy) Choose(k, match int) (int, int) {
	if k == 0 || len(p.lengths) == 0 {
		return 0, 1
	}
	shortest := func(n int) int {
		for _, l := range p.lengths {
			if l >= n+1 {
				return l
			}
		}
		return p.lengths[len(p.lengths)-1]
	}
	if p.always {
		l := shortest(k)
		return min(k, l-1), l
	}
	c1, ok := p.cost[1]
	if !ok {
		return 0, 1 // measure decoding first, past its first (cold) pass
	}
	// a verify must promise a margin over plain decoding: its cost and acceptance are
	// estimates from noisy wall-clock times and a few passes
	bestK, bestL, best := 0, 1, margin/c1
	for _, l := range p.lengths {
		kk := min(k, l-1)
		c := p.ratio(l) * c1
		if s := p.expected(kk, matchBucket(match)) / c; s > best {
			bestK, bestL, best = kk, l, s
		}
		if kk == k {
			break // longer graphs verify nothing more
		}
	}
	if bestK > 0 {
		p.skipped = 0
		return bestK, bestL
	}
	if p.skipped++; p.skipped >= p.probe {
		p.skipped = 0
		p.probe = min(4*p.probe, probeMax)
		l := shortest(min(k, p.lengths[0]-1))
		return min(k, l-1), l
	}
	return 0, 1
}

// ratio is verify length l's cost in decode passes. Measured, it is a moving minimum of each
// pass's time over the decode cost of that moment, so that a change of the machine's speed
// (the first passes' warm-up above all) moves every length alike. While a length has fewer
// than three timed passes it is taken no dearer than its guess: a length judged too dear is not
// run again to correct that, and one early pass timed at 2.3 decodes (a true 1.35) used to keep
// verify-4 out of a whole stories260K run, ~1 run in 15.
func (p *Policy) ratio(l int) float64 {
	g := p.guessRatio(l)
	r, ok := p.cost[l]
	switch {
	case !ok:
		return g
	case p.runs[l] < 4: // the first pass is not timed
		return min(r, g)
	}
	return r
}

// guessRatio is the cost in decode passes of a verify length not timed yet: the longest
// shorter one timed times the square root of the length ratio (between a weight-bound pass,
// which costs about the same, and a compute-bound one, which costs proportionally more:
// optimistic enough that a length gets measured once the shorter ones nearly pay), or for the
// shortest 1.5.
func (p *Policy) guessRatio(l int) float64 {
	for i := len(p.lengths) - 1; i >= 0; i-- {
		if k := p.lengths[i]; k < l {
			if _, ok := p.cost[k]; ok {
				return p.ratio(k) * math.Sqrt(float64(l)/float64(k))
			}
		}
	}
	if l == p.lengths[0] {
		return 1.5
	}
	return math.Sqrt(float64(l))
}

// Observe records a pass: its length (1: decode), wall time, draft tokens and accepted ones,
// and the draft's match length.
func (p *Policy) Observe(l int, d time.Duration, drafted, accepted, match int) {
	s := d.Seconds()
	// The first pass of a graph runs cold (page faults, first touches of its buffers): it would
	// make its length look far dearer than it is, and a length that looks dear is not run again
	// to correct that. So the first pass of each length is not timed (a verify length's cost is
	// guessed until then, decoding is measured again). After it, a pass that ran slower than
	// usual was mostly slowed by something else (another process taking the core): the cost
	// follows a faster pass at once and a slower one by little.
	p.runs[l]++
	v := s // decode: seconds; a verify length: decode passes (ratio)
	c1, timed := p.cost[1]
	timed = timed && c1 > 0 // a clock too coarse to time a decode gives no ratio
	if l > 1 && timed {
		v /= c1
	}
	if p.runs[l] > 1 && (l == 1 || timed) {
		if c, ok := p.cost[l]; !ok || v < c {
			p.cost[l] = v
		} else {
			p.cost[l] = 0.95*c + 0.05*v
		}
	}
	if drafted == 0 {
		return
	}
	for _, b := range []int{0, matchBucket(match)} {
		for i := range p.tried[b] {
			p.tried[b][i] *= decay
			p.hit[b][i] *= decay
		}
		// position i was put to the test when the ones before it were accepted
		for i := range min(drafted, accepted+1) {
			p.tried[b][i]++
			if i < accepted {
				p.hit[b][i]++
			}
		}
	}
	if c1, ok := p.cost[1]; ok && float64(accepted+1)/s >= margin/c1 {
		p.probe = probeFirst // this pass beat plain decoding: probe eagerly again
	}
}
