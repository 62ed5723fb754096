package spec

import (
	"math"
	"slices"

	"github.com/xpuhub/xpu/llm/draft"
)

// TopCandidates are the k most likely tokens of logits with their softmax probabilities.
func TopCandidates(logits []float32, k int) []draft.Candidate {
	if len(logits) == 0 || k <= 0 {
		return nil
	}
	mx := slices.Max(logits)
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
