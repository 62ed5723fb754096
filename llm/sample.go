package llm

import (
	"math"
	"math/rand/v2"
	"sort"
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

// Sampler draws tokens; it is deterministic for a given seed.
type Sampler struct {
	cfg SamplerConfig
	rng *rand.Rand
}

// NewSampler makes a sampler.
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
	if p := s.cfg.RepeatPenalty; p > 0 && p != 1 {
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
	if s.cfg.Temperature <= 0 {
		return argmax(logits)
	}
	type cand struct {
		id int32
		p  float64
	}
	cands := make([]cand, len(logits))
	for i, l := range logits {
		cands[i] = cand{int32(i), float64(l)}
	}
	sort.SliceStable(cands, func(a, b int) bool { return cands[a].p > cands[b].p })
	if k := s.cfg.TopK; k > 0 && k < len(cands) {
		cands = cands[:k]
	}
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
	r := s.rng.Float64()
	for _, c := range cands {
		r -= c.p
		if r < 0 {
			return c.id
		}
	}
	return cands[len(cands)-1].id
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
