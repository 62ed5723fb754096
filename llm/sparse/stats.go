package sparse

import (
	"context"
	"fmt"
	"sort"

	"github.com/xpuhub/xpu/llm"
)

// Stats is measured FFN firing of a model over some tokens.
type Stats struct {
	Tokens int
	// Sparsity is the share of (token, neuron) pairs whose gate is ≤ 0, over all layers.
	Sparsity float64
	// LayerSparsity is the same per layer.
	LayerSparsity []float64
	// Top10Share is the share of all activations that the 10% most frequently active neurons
	// of each layer account for (0.1 without skew, near 1 with a strong one).
	Top10Share float64
	// HotNeurons is the share of neurons active for more than half of the tokens.
	HotNeurons float64
	// Freq is each layer's per-neuron activation frequency (model order).
	Freq [][]float32
}

// Measure profiles how often each FFN neuron's gate is > 0 over tokens (teacher-forced: the
// activations a decode of this text computes), with the Go forward pass.
func Measure(ctx context.Context, m *llm.Model, tokens []int32) (Stats, error) {
	c := m.Config
	st := Stats{Tokens: len(tokens), Freq: make([][]float32, c.Layers), LayerSparsity: make([]float64, c.Layers)}
	_, err := Forward(ctx, m, tokens, func(l int, _, gate []float32) error {
		cnt := make([]float32, c.FFN)
		for i, g := range gate {
			if g > 0 {
				cnt[i%c.FFN]++
			}
		}
		for i := range cnt {
			cnt[i] /= float32(len(tokens))
		}
		st.Freq[l] = cnt
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("sparse: measuring: %w", err)
	}
	var act, top, hot float64
	for l, f := range st.Freq {
		s := append([]float32(nil), f...)
		sort.Slice(s, func(a, b int) bool { return s[a] > s[b] })
		var sum, t float64
		for i, v := range s {
			sum += float64(v)
			if i < len(s)/10 {
				t += float64(v)
			}
			if v > 0.5 {
				hot++
			}
		}
		st.LayerSparsity[l] = 1 - sum/float64(len(s))
		act += sum
		top += t
	}
	n := float64(c.Layers * c.FFN)
	st.Sparsity = 1 - act/n
	if act > 0 {
		st.Top10Share = top / act
	}
	st.HotNeurons = hot / n
	return st, nil
}
