// Package sample chooses the next token from a model's logits: greedy or sampled (top-k,
// top-p, min-p, typical-p, temperature), after logit biases and the repeat, frequency and
// presence penalties, in llama.cpp's order; the log-probabilities OpenAI reports;
// speculative sampling's acceptance rule; and sampling held to a constraint (a grammar).
package sample

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/xpuhub/xpu/core"
)

// MaxTopLogprobs bounds Config.TopLogprobs (OpenAI's limit).
const MaxTopLogprobs = 20

// Config chooses the next token from logits. The zero value is greedy (argmax).
//
// The order is llama.cpp's: logit biases, then the penalties over the last RepeatLastN tokens
// of the history (repeat, frequency, presence), then, when sampling (Temperature > 0), top-k,
// the softmax at the temperature, typical-p, top-p and min-p, and a draw.
type Config struct {
	Temperature float32 // 0 = greedy
	TopK        int     // keep the k most likely; 0 = all
	TopP        float32 // nucleus: smallest set with this much probability; 0 or 1 = all
	// MinP drops the tokens less likely than MinP times the most likely one; 0 = off.
	MinP float32
	// TypicalP keeps the tokens whose surprise is closest to the distribution's entropy, up to
	// this much probability (locally typical sampling); 0 or 1 = off.
	TypicalP float32
	// RepeatPenalty > 1 makes tokens seen in the last RepeatLastN positions less likely
	// (llama.cpp's rule: positive logits divided, negative multiplied). 0 or 1 = off.
	RepeatPenalty float32
	RepeatLastN   int // 0 = 64
	// FrequencyPenalty is subtracted from a token's logit once per time it occurs in the last
	// RepeatLastN positions, PresencePenalty once if it occurs at all (OpenAI's definitions;
	// negative values favour repetition). 0 = off.
	FrequencyPenalty float32
	PresencePenalty  float32
	// LogitBias is added to the logits of the tokens it names before anything else (OpenAI's
	// logit_bias; -100 in practice bans a token, 100 forces it).
	LogitBias map[int32]float32
	Seed      uint64
	// Logprobs, when set, receives each token Sample picks with its log-probability and the
	// TopLogprobs most likely tokens (see TokenLogprob).
	Logprobs    func(TokenLogprob)
	TopLogprobs int // 0 to MaxTopLogprobs
}

// TokenLogprob is a sampled token's log-probability and the most likely alternatives, taken
// from the logits after the biases and penalties (the ones the sampler chooses from) at
// temperature 1, before truncation: the same figures for a greedy and a sampled request, as
// OpenAI reports them.
type TokenLogprob struct {
	ID      int32
	Logprob float64
	Top     []TokenProb // most likely first; TopLogprobs long (or the vocabulary's size)
}

// TokenProb is one candidate token's log-probability.
type TokenProb struct {
	ID      int32
	Logprob float64
}

// Validate reports the first field outside its range, wrapping core.ErrInvalidArgument: a NaN
// temperature or a nucleus mass above 1 would otherwise sample as if greedy or as if off,
// silently.
func (c Config) Validate() error {
	bad := func(name string, v any, want string) error {
		return fmt.Errorf("sample: sampler %s %v: must be %s: %w", name, v, want, core.ErrInvalidArgument)
	}
	finite := func(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }
	unit := func(x float32) bool { return finite(x) && x >= 0 && x <= 1 }
	switch {
	case !finite(c.Temperature) || c.Temperature < 0:
		return bad("temperature", c.Temperature, "finite and 0 (greedy) or more")
	case !unit(c.TopP):
		return bad("top-p", c.TopP, "between 0 and 1")
	case !unit(c.MinP):
		return bad("min-p", c.MinP, "between 0 and 1")
	case !unit(c.TypicalP):
		return bad("typical-p", c.TypicalP, "between 0 and 1")
	case c.TopK < 0:
		return bad("top-k", c.TopK, "0 (off) or more")
	case !finite(c.RepeatPenalty) || c.RepeatPenalty < 0:
		return bad("repeat penalty", c.RepeatPenalty, "finite and 0 or more (0 and 1 are off)")
	case c.RepeatLastN < 0:
		return bad("repeat window", c.RepeatLastN, "0 (64) or more")
	case !finite(c.FrequencyPenalty):
		return bad("frequency penalty", c.FrequencyPenalty, "finite")
	case !finite(c.PresencePenalty):
		return bad("presence penalty", c.PresencePenalty, "finite")
	case c.TopLogprobs < 0 || c.TopLogprobs > MaxTopLogprobs:
		return bad("top logprobs", c.TopLogprobs, fmt.Sprintf("0 to %d", MaxTopLogprobs))
	}
	for id, b := range c.LogitBias {
		if id < 0 {
			return bad("logit bias token", id, "0 or more")
		}
		if !finite(b) {
			return bad(fmt.Sprintf("logit bias of token %d", id), b, "finite")
		}
	}
	return nil
}

// Truncates reports whether the sampler keeps only part of the distribution before drawing
// (top-k, top-p): a grammar constraint then masks the whole vocabulary before the draw
// instead of drawing first and masking only on a refusal, which is exact only without a cut.
func (c Config) Truncates() bool {
	if c.Temperature <= 0 {
		return false
	}
	return c.TopK > 0 || (c.TopP > 0 && c.TopP < 1)
}

// Sampler draws tokens; it is deterministic for a given seed.
type Sampler struct {
	cfg    Config
	rng    *rand.Rand
	counts map[int32]int // penalize's scratch: occurrences in the window
	buf    []float32     // Predict's and AcceptDraft's copy of the logits
}

// New makes a sampler. It does not check cfg: llm.Generate validates it (see Validate).
func New(cfg Config) *Sampler {
	if cfg.RepeatLastN == 0 {
		cfg.RepeatLastN = 64
	}
	return &Sampler{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
}

// Sample picks the next token given the logits and the tokens so far (for the penalties).
// logits is modified. It returns -1 for empty logits.
func (s *Sampler) Sample(logits []float32, history []int32) int32 {
	if len(logits) == 0 {
		return -1
	}
	s.penalize(logits, history)
	var id int32
	if s.cfg.Temperature <= 0 {
		id = Argmax(logits)
	} else {
		id = s.draw(s.dist(logits))
	}
	if s.cfg.Logprobs != nil {
		s.cfg.Logprobs(logprobsOf(logits, id, s.cfg.TopLogprobs))
	}
	return id
}

// logprobsOf is id's log-probability under the softmax of logits and the top n tokens'.
func logprobsOf(logits []float32, id int32, n int) TokenLogprob {
	maxL := math.Inf(-1)
	for _, l := range logits {
		maxL = max(maxL, float64(l))
	}
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l) - maxL)
	}
	lse := maxL + math.Log(sum)
	out := TokenLogprob{ID: id, Logprob: float64(logits[id]) - lse}
	if n = min(n, len(logits)); n > 0 {
		cands := make([]cand, len(logits))
		for i, l := range logits {
			cands[i] = cand{int32(i), float64(l)}
		}
		if n < len(cands) {
			cands = bestK(cands, n)
		}
		slices.SortFunc(cands, candOrder)
		out.Top = make([]TokenProb, n)
		for i, c := range cands[:n] {
			out.Top[i] = TokenProb{ID: c.id, Logprob: c.p - lse}
		}
	}
	return out
}

// penalize adds the logit biases and applies the penalties to logits.
func (s *Sampler) penalize(logits []float32, history []int32) {
	for id, b := range s.cfg.LogitBias {
		if int(id) < len(logits) {
			logits[id] += b
		}
	}
	c := &s.cfg
	if !(c.RepeatPenalty > 0 && c.RepeatPenalty != 1) && c.FrequencyPenalty == 0 && c.PresencePenalty == 0 {
		return
	}
	if s.counts == nil {
		s.counts = map[int32]int{}
	}
	clear(s.counts)
	for _, t := range history[max(0, len(history)-c.RepeatLastN):] {
		if t >= 0 && int(t) < len(logits) {
			s.counts[t]++
		}
	}
	for t, n := range s.counts {
		if p := c.RepeatPenalty; p > 0 && p != 1 {
			if logits[t] > 0 {
				logits[t] /= p
			} else {
				logits[t] *= p
			}
		}
		logits[t] -= float32(n)*c.FrequencyPenalty + c.PresencePenalty
	}
}

// Predict is the greedy choice after the biases and penalties: what Sample picks at
// temperature 0. logits is not modified: without a bias or penalty it is read in place (a
// speculative step predicts at every verified row, where copying the vocabulary each time
// costs more than the argmax).
func (s *Sampler) Predict(logits []float32, history []int32) int32 {
	if !s.Penalizes() {
		return Argmax(logits)
	}
	s.buf = append(s.buf[:0], logits...)
	s.penalize(s.buf, history)
	return Argmax(s.buf)
}

// AcceptDraft applies speculative sampling's rule at one verified row: given the row's logits
// (not modified) and the tokens of its draft children (tokens[c] for c in kids, in order), it
// returns the child kept (-1: none) and the token drawn, which is the kept child's when one is
// (acceptTree says how; each token keeps plain sampling's probability).
func (s *Sampler) AcceptDraft(logits []float32, history []int32, tokens []int32, kids []int) (int, int32) {
	s.buf = append(s.buf[:0], logits...)
	s.penalize(s.buf, history)
	return acceptTree(s, s.dist(s.buf), tokens, kids)
}

// Penalizes says whether the sampler changes logits before choosing (a bias, or a penalty that
// is not off).
func (s *Sampler) Penalizes() bool {
	c := &s.cfg
	return len(c.LogitBias) > 0 || (c.RepeatPenalty > 0 && c.RepeatPenalty != 1) ||
		c.FrequencyPenalty != 0 || c.PresencePenalty != 0
}

// dist is the distribution Sample draws from when it samples (Temperature > 0): the candidates
// left by top-k, typical-p, top-p and min-p, most likely first, their probabilities summing
// to 1.
func (s *Sampler) dist(logits []float32) []cand {
	cands := make([]cand, len(logits))
	for i, l := range logits {
		cands[i] = cand{int32(i), float64(l)}
	}
	if k := s.cfg.TopK; k > 0 && k < len(cands) {
		cands = bestK(cands, k)
	}
	slices.SortFunc(cands, candOrder)
	maxL := cands[0].p
	var sum float64
	for i := range cands {
		cands[i].p = math.Exp((cands[i].p - maxL) / float64(s.cfg.Temperature))
		sum += cands[i].p
	}
	for i := range cands {
		cands[i].p /= sum
	}
	if tp := float64(s.cfg.TypicalP); tp > 0 && tp < 1 {
		cands = typical(cands, tp)
	}
	if tp := float64(s.cfg.TopP); tp > 0 && tp < 1 {
		var acc float64
		for i := range cands {
			acc += cands[i].p
			if acc >= tp {
				cands = cands[:i+1]
				break
			}
		}
		normalize(cands)
	}
	if mp := float64(s.cfg.MinP); mp > 0 {
		// cands is most likely first: the kept tokens are a prefix
		floor := mp * cands[0].p
		n := 1
		for n < len(cands) && cands[n].p >= floor {
			n++
		}
		cands = cands[:n]
		normalize(cands)
	}
	return cands
}

// typical keeps the candidates (normalized, most likely first) whose surprise -log p is
// closest to the entropy, until they hold mass p, as llama.cpp's typical sampler does; the
// result is renormalized and most likely first again.
func typical(cands []cand, mass float64) []cand {
	var ent float64
	for _, c := range cands {
		if c.p > 0 {
			ent -= c.p * math.Log(c.p)
		}
	}
	shift := func(c cand) float64 { return math.Abs(-math.Log(c.p) - ent) }
	byShift := slices.Clone(cands)
	slices.SortStableFunc(byShift, func(a, b cand) int { return cmp.Compare(shift(a), shift(b)) })
	var acc float64
	n := len(byShift)
	for i, c := range byShift {
		acc += c.p
		if acc > mass {
			n = i + 1
			break
		}
	}
	kept := byShift[:n]
	slices.SortFunc(kept, candOrder)
	normalize(kept)
	return kept
}

func normalize(cands []cand) {
	var sum float64
	for _, c := range cands {
		sum += c.p
	}
	for i := range cands {
		cands[i].p /= sum
	}
}

// draw samples from a distribution (dist's).
func (s *Sampler) draw(cands []cand) int32 {
	r := s.rng.Float64()
	for _, c := range cands {
		r -= c.p
		if r < 0 {
			return c.id
		}
	}
	return cands[len(cands)-1].id
}

type cand struct {
	id int32
	p  float64
}

// candOrder puts the most likely first, ties in id order (what a stable sort by probability
// gives); a total order, so the faster unstable sort gives the same result.
func candOrder(a, b cand) int {
	switch {
	case a.p > b.p:
		return -1
	case a.p < b.p:
		return 1
	}
	return cmp.Compare(a.id, b.id)
}

// bestK returns the k (0 < k < len(cs)) first candidates under candOrder, unordered, in the
// front of cs: a heap of the k best so far, whose root is the worst of them, so a vocabulary is
// not sorted whole for top-k.
func bestK(cs []cand, k int) []cand {
	h := cs[:k]
	worse := func(i, j int) bool { return candOrder(h[i], h[j]) > 0 }
	down := func(i int) {
		for {
			w := i
			for _, c := range [2]int{2*i + 1, 2*i + 2} {
				if c < k && worse(c, w) {
					w = c
				}
			}
			if w == i {
				return
			}
			h[i], h[w] = h[w], h[i]
			i = w
		}
	}
	for i := k/2 - 1; i >= 0; i-- {
		down(i)
	}
	for _, c := range cs[k:] {
		if candOrder(c, h[0]) < 0 {
			h[0] = c
			down(0)
		}
	}
	return h
}

// Argmax returns the first index of the largest logit (NaN never wins).
func Argmax(xs []float32) int32 {
	best := 0
	for i, x := range xs {
		if x > xs[best] || (math.IsNaN(float64(xs[best])) && !math.IsNaN(float64(x))) {
			best = i
		}
	}
	return int32(best)
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
