package sample

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// allowSet is a Constraint that allows the tokens of a set, counting the calls made to it;
// after done accepted tokens it is Done.
type allowSet struct {
	ok                     map[int32]bool
	done                   int
	resets, masks, accepts int
	maskErr, acceptErr     error
}

func (a *allowSet) Reset() { a.resets++; a.accepts = 0 }
func (a *allowSet) Mask(logits []float32) error {
	a.masks++
	if a.maskErr != nil {
		return a.maskErr
	}
	for i := range logits {
		if !a.ok[int32(i)] {
			logits[i] = float32(math.Inf(-1))
		}
	}
	return nil
}
func (a *allowSet) Accept(id int32) error {
	if !a.ok[id] {
		return errors.New("refused token")
	}
	a.accepts++
	return a.acceptErr
}
func (a *allowSet) Done() bool { return a.done > 0 && a.accepts >= a.done }

// checking is an allowSet with the draw-first shortcut.
type checking struct{ *allowSet }

func (c checking) Allows(id int32) bool { return c.ok[id] }

func TestConstrained(t *testing.T) {
	logits := func() []float32 { return []float32{1, 3, 2, 2.9, -1} }
	for _, c := range []struct {
		name      string
		cfg       Config
		checker   bool
		ok        map[int32]bool
		want      int32 // -1: any allowed token
		wantMasks int   // Mask calls over one draw
	}{
		{"greedy, masked", Config{}, false, map[int32]bool{2: true, 4: true}, 2, 1},
		{"greedy, draw allowed first", Config{}, true, map[int32]bool{1: true, 4: true}, 1, 0},
		{"greedy, draw refused then masked", Config{}, true, map[int32]bool{2: true, 4: true}, 2, 1},
		{"sampled, draw first", Config{Temperature: 1, Seed: 5}, true, map[int32]bool{0: true, 2: true}, -1, -1},
		// a truncating sampler would draw from a cut that may hold no allowed token: mask first
		{"top-k always masks", Config{Temperature: 1, TopK: 2, Seed: 5}, true, map[int32]bool{0: true, 4: true}, -1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			set := &allowSet{ok: c.ok}
			var con Constraint = set
			if c.checker {
				con = checking{set}
			}
			h := Constrain(New(c.cfg), con)
			assert.Equal(t, 1, set.resets, "Constrain starts the constraint over")
			for range 20 {
				masks := set.masks
				id, err := h.Sample(logits(), nil)
				require.NoError(t, err)
				assert.True(t, c.ok[id], "token %d is not allowed", id)
				if c.want >= 0 {
					assert.Equal(t, c.want, id)
				}
				if c.wantMasks >= 0 {
					assert.Equal(t, c.wantMasks, set.masks-masks)
				}
			}
			assert.Equal(t, 20, set.accepts)
		})
	}
}

func TestConstrainedErrorsAndDone(t *testing.T) {
	boom := errors.New("boom")
	h := Constrain(New(Config{}), &allowSet{ok: map[int32]bool{1: true}, maskErr: boom})
	_, err := h.Sample([]float32{1, 3}, nil)
	require.ErrorIs(t, err, boom)
	assert.EqualError(t, err, "constraint: boom")

	h = Constrain(New(Config{}), &allowSet{ok: map[int32]bool{1: true}, acceptErr: boom})
	id, err := h.Sample([]float32{1, 3}, nil)
	assert.Equal(t, int32(1), id)
	require.ErrorIs(t, err, boom)

	set := &allowSet{ok: map[int32]bool{0: true, 1: true}, done: 2}
	h = Constrain(New(Config{}), set)
	for _, want := range []bool{false, true} {
		_, err := h.Sample([]float32{1, 3}, nil)
		require.NoError(t, err)
		assert.Equal(t, want, h.Done())
	}

	plain := Constrain(New(Config{}), nil)
	id, err = plain.Sample([]float32{1, 3, 2}, nil)
	require.NoError(t, err)
	assert.Equal(t, int32(1), id, "without a constraint it samples as the sampler does")
	assert.False(t, plain.Done())
}
