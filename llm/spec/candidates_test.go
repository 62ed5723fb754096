package spec

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm/draft"
)

func TestTopCandidates(t *testing.T) {
	for _, c := range []struct {
		name   string
		logits []float32
		k      int
		ids    []int32
	}{
		{"the k largest, most likely first", []float32{0, 3, 1, 2}, 2, []int32{1, 3}},
		{"k beyond the vocabulary gives every token", []float32{1, 0}, 5, []int32{0, 1}},
		{"no logits", nil, 3, nil},
		{"k of zero", []float32{1, 2}, 0, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := TopCandidates(c.logits, c.k)
			var ids []int32
			for _, g := range got {
				ids = append(ids, g.ID)
			}
			assert.Equal(t, c.ids, ids)
		})
	}
	// probabilities are the softmax over every logit, not only the kept ones
	got := TopCandidates([]float32{0, 0, 0, 0}, 1)
	require.Equal(t, []draft.Candidate{{ID: 0, P: 0.25}}, got)
}
