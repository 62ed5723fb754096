package spec

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The stats say what happened.
func TestStatsString(t *testing.T) {
	s := &Stats{Passes: 4, Verifies: 2, Plain: 2, Drafted: 10, Accepted: 4, Histogram: []int{1, 0, 0, 0, 1},
		Lengths: map[int]int{8: 2}}
	assert.InDelta(t, 2.0, s.TokensPerPass(), 1e-9)
	out := s.String()
	for _, want := range []string{"2.00 tokens/pass", "8×2", "0:1 4:1", "40%"} {
		assert.Contains(t, out, want)
	}
}
