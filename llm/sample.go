package llm

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/xpuhub/xpu/core"
)

// SamplerConfig chooses the next token from logits. The zero value is greedy (argmax).
type SamplerConfig struct {
	Temperature float32 // 0 = greedy
	TopK        int     // keep the k most likely; 0 = all
	TopP        float32 // nucleus: smallest set with this much probability; 0 or 1 = all
	// RepeatPenalty > 1 makes tokens seen in the last RepeatLastN positions less likely
	// (llama.cpp's rule: positive logits divided, negative multiplied). 0 or 1 = off.
	RepeatPenalty float32
	RepeatLastN   int // 0 = 64
	Seed          uint64
}

// Validate reports the first field outside its range, wrapping core.ErrInvalidArgument: a NaN
// temperature or a nucleus mass above 1 would otherwise sample as if greedy or as if off,
// silently.
func (c SamplerConfig) Validate() error {
	bad := func(name string, v any, want string) error {
		return fmt.Errorf("llm: sampler %s %v: must be %s: %w", name, v, want, core.ErrInvalidArgument)
	}
	finite := func(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }
	switch {
	case !finite(c.Temperature) || c.Temperature < 0:
		return bad("temperature", c.Temperature, "finite and 0 (greedy) or more")
	case !finite(c.TopP) || c.TopP < 0 || c.TopP > 1:
		return bad("top-p", c.TopP, "between 0 and 1")
	case c.TopK < 0:
		return bad("top-k", c.TopK, "0 (off) or more")
	case !finite(c.RepeatPenalty) || c.RepeatPenalty < 0:
		return bad("repeat penalty", c.RepeatPenalty, "finite and 0 or more (0 and 1 are off)")
	case c.RepeatLastN < 0:
		return bad("repeat window", c.RepeatLastN, "0 (64) or more")
	}
	return nil
}

// Sampler draws tokens; it is deterministic for a given seed.
type Sampler struct {
	cfg SamplerConfig
	rng *rand.Rand
}

// NewSampler makes a sampler. It does not check cfg: Generate validates it (see Validate).
func NewSampler(cfg SamplerConfig) *Sampler {
	if cfg.RepeatLastN == 0 {
		cfg.RepeatLastN = 64
	}
	return &Sampler{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
}

// Sample picks the next token given the logits and the tokens so far (for the repetition
// penalty). logits is modified. It returns -1 for empty logits.
func (s *Sampler) Sample(logits []float32, history []int32) int32 {
	if len(logits) == 0 {
		return -1
	}
	s.penalize(logits, history)
	if s.cfg.Temperature <= 0 {
		return argmax(logits)
	}
	return s.draw(s.dist(logits))
}

// penalize applies the repetition penalty to logits.
func (s *Sampler) penalize(logits []float32, history []int32) {
	if s.penalizes() {
		p := s.cfg.RepeatPenalty
		seen := map[int32]bool{}
		for _, t := range history[max(0, len(history)-s.cfg.RepeatLastN):] {
			if t < 0 || int(t) >= len(logits) || seen[t] {
				continue
			}
			seen[t] = true
			if logits[t] > 0 {
				logits[t] /= p
			} else {
				logits[t] *= p
			}
		}
	}
}

// penalizes says whether penalize changes logits (a repeat penalty other than 0 and 1).
func (s *Sampler) penalizes() bool { p := s.cfg.RepeatPenalty; return p > 0 && p != 1 }

// dist is the distribution Sample draws from when it samples (Temperature > 0): the candidates
// left by top-k and top-p, most likely first, their probabilities summing to 1.
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
	if tp := float64(s.cfg.TopP); tp > 0 && tp < 1 {
		var acc float64
		for i := range cands {
			acc += cands[i].p
			if acc >= tp {
				cands = cands[:i+1]
				sum = acc
				break
			}
		}
		for i := range cands {
			cands[i].p /= sum
		}
	}
	return cands
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

// argmax returns the first index of the largest logit (NaN never wins).
func argmax(xs []float32) int32 {
	best := 0
	for i, x := range xs {
		if x > xs[best] || (math.IsNaN(float64(xs[best])) && !math.IsNaN(float64(x))) {
			best = i
		}
	}
	return int32(best)
}
