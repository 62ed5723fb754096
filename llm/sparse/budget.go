package sparse

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// budgetSplit is how a runtime divides its memory budget: the fixed region (every weight
// outside the FFN, the KV cache, the predictors), the I/O staging buffer, the hot rows each
// layer keeps resident and the cold slots shared by every layer's other neurons.
type budgetSplit struct {
	Budget  int64
	Fixed   Fixed
	Staging int64
	// Hot is each layer's resident rows (a prefix of its hot-first bundle order); Demoted is
	// how many of the sidecar's hot rows the budget could not keep resident.
	Hot     []int
	Demoted int
	// Promoted is how many rows past the sidecar's hot ones a roomier budget keeps resident.
	Promoted int
	Slots    int64
	// Bounded: the budget cannot hold a whole layer's selection; Select drops the overflow.
	Bounded bool
}

// HotRows is the total of Hot.
func (b budgetSplit) HotRows() int64 {
	var n int64
	for _, h := range b.Hot {
		n += int64(h)
	}
	return n
}

// splitBudget sizes the regions. Every layer's selection should fit the cache at once (its
// resident rows plus up to F − hot cold rows, all needed by the same SPARSE_FFN pair), so the
// cold slots should number at least max over layers of F − hot; when the budget does not leave
// that, the least frequent hot rows (freq: per layer and bundle row) are demoted to cold ones.
//
// A budget that cannot hold one whole layer's neurons besides the fixed region cannot give that
// guarantee: the split is then Bounded, the hot rows keep at most three quarters of what the
// fixed region leaves (least frequent demoted first), and Select drops what does not fit. The
// I/O buffer shrinks to one row (staging: the wanted size, stagingMin: the least) when the
// wanted one would take the room of a layer's neurons. Only a budget with no room for a single
// row besides the fixed region and the I/O buffer is refused.
//
// With promote, a budget with room to spare beyond that keeps more rows resident than the sidecar planned
// (the most frequent next row of any layer first) for as long as the worst layer's cold
// selection still fits the slots: a row resident costs the same memory as a cold slot and is
// never read again, and a budget that holds every neuron reads nothing per token.
func splitBudget(budget int64, fx Fixed, staging, stagingMin, rowBytes int64, F int, hot0 []int, freq func(l, i int) float32, promote bool) (budgetSplit, error) {
	s := budgetSplit{Budget: budget, Fixed: fx, Staging: staging, Hot: append([]int(nil), hot0...)}
	if budget-fx.Total()-staging < int64(F)*rowBytes {
		s.Staging = stagingMin
	}
	if budget < fx.Total()+s.Staging+rowBytes {
		return s, fmt.Errorf("sparse: budget %s too small: fixed region needs %s (non-FFN weights %s + KV cache %s + predictors %s), the I/O buffer %s and one neuron row %d bytes: %w (%w)",
			mib(budget), mib(fx.Total()), mib(fx.Weights), mib(fx.KV), mib(fx.Predictors), mib(s.Staging), rowBytes, core.ErrInvalidArgument, ErrBudget)
	}
	avail := (budget - fx.Total() - s.Staging) / rowBytes
	if avail < int64(F) {
		s.Bounded = true
		keep := avail - max(1, avail/4)
		sum := int64(0)
		for _, h := range s.Hot {
			sum += int64(h)
		}
		for ; sum > keep; sum-- {
			best := -1
			for l, h := range s.Hot {
				if h > 0 && (best < 0 || freq(l, h-1) < freq(best, s.Hot[best]-1)) {
					best = l
				}
			}
			s.Hot[best]--
			s.Demoted++
		}
		s.Slots = avail - sum
		return s, nil
	}
	sum, total := int64(0), int64(F)*int64(len(s.Hot))
	minHot := F
	for _, h := range s.Hot {
		sum += int64(h)
		minHot = min(minHot, h)
	}
	for sum+int64(F-minHot) > avail {
		// Demote the least frequent of the last hot rows of the layers above the minimum (each
		// frees a row without raising the worst selection); when every layer is at the minimum,
		// lower it where it costs least.
		best, lowest := -1, false
		for l, h := range s.Hot {
			if h > minHot && (best < 0 || freq(l, h-1) < freq(best, s.Hot[best]-1)) {
				best = l
			}
		}
		if best < 0 {
			lowest = true
			for l, h := range s.Hot {
				if h > 0 && (best < 0 || freq(l, h-1) < freq(best, s.Hot[best]-1)) {
					best = l
				}
			}
		}
		s.Hot[best]--
		s.Demoted++
		sum--
		if lowest {
			minHot = s.Hot[best]
		}
	}
	// lo is the fewest resident rows of any layer (the worst layer's cold part is F − lo) and
	// atLo how many layers have that few: promoting the only one raises lo.
	lo, atLo := F, 0
	for _, h := range s.Hot {
		if h < lo {
			lo, atLo = h, 0
		}
		if h == lo {
			atLo++
		}
	}
	for promote {
		best := -1
		for l, h := range s.Hot {
			if h >= F || (best >= 0 && freq(l, h) <= freq(best, s.Hot[best])) {
				continue
			}
			newLo := lo
			if h == lo && atLo == 1 {
				newLo = lo + 1 // every other layer holds more
			}
			if sum+1+int64(F-newLo) <= avail {
				best = l
			}
		}
		if best < 0 {
			break
		}
		if s.Hot[best] == lo {
			if atLo--; atLo == 0 {
				lo++
				for _, h := range s.Hot {
					if h == lo {
						atLo++
					}
				}
				atLo++ // best itself, now at lo
			}
		}
		s.Hot[best]++
		s.Promoted++
		sum++
	}
	s.Slots = min(avail-sum, total-sum)
	return s, nil
}
