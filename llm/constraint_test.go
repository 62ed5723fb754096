package llm

import (
	"context"
	"errors"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/grammar"
	"github.com/xpuhub/xpu/llm/sample"
)

// recording wraps a constraint and counts the calls Generate makes.
type recording struct {
	sample.Constraint
	resets, masks, accepts int
	maskErr                error
}

func (r *recording) Reset()                { r.resets++; r.Constraint.Reset() }
func (r *recording) Accept(id int32) error { r.accepts++; return r.Constraint.Accept(id) }
func (r *recording) Mask(logits []float32) error {
	r.masks++
	if r.maskErr != nil {
		return r.maskErr
	}
	return r.Constraint.Mask(logits)
}

func TestGenerateWithConstraint(t *testing.T) {
	m := openStories(t)
	r, err := NewRunner(context.Background(), m, refDevice(t))
	require.NoError(t, err)
	defer r.Close()
	g, err := grammar.Parse(`root ::= "Lily " ("ran" | "sat") " to the " [a-z]{1,8} "."`)
	require.NoError(t, err)
	want := regexp.MustCompile(`^Lily (ran|sat) to the [a-z]{1,8}\.$`)
	for _, temp := range []float32{0, 1, 1.5} {
		c := &recording{Constraint: grammar.NewTokenMatcher(g, m.Tokenizer)}
		for seed := uint64(1); seed <= 3; seed++ {
			res, err := r.Generate(context.Background(), "Once upon a time", WithMaxTokens(64),
				WithSampler(sample.Config{Temperature: temp, Seed: seed}), WithConstraint(c))
			require.NoError(t, err)
			assert.Regexp(t, want, res.Text, "temperature %g seed %d", temp, seed)
			assert.Equal(t, StopEOS, res.Stop, "the grammar's end stops generation")
		}
		assert.Equal(t, 3, c.resets, "each Generate starts the constraint over")
		assert.Equal(t, c.masks, c.accepts)
	}

	// sampling first and masking on refusal (the matcher's cheap check) gives greedy's answer
	// of masking every step
	for _, prompt := range []string{"Once upon a time", "The dog", "Tim and"} {
		masked := &recording{Constraint: grammar.NewTokenMatcher(g, m.Tokenizer)}
		a, err := r.Generate(context.Background(), prompt, WithMaxTokens(64), WithConstraint(masked))
		require.NoError(t, err)
		b, err := r.Generate(context.Background(), prompt, WithMaxTokens(64), WithConstraint(grammar.NewTokenMatcher(g, m.Tokenizer)))
		require.NoError(t, err)
		assert.Equal(t, a.Text, b.Text)
		assert.Regexp(t, want, b.Text)
	}

	// without the constraint the model writes something else
	res, err := r.Generate(context.Background(), "Once upon a time", WithMaxTokens(16))
	require.NoError(t, err)
	assert.NotRegexp(t, want, res.Text)
}

func TestGenerateConstraintErrors(t *testing.T) {
	m := openStories(t)
	r, err := NewRunner(context.Background(), m, refDevice(t))
	require.NoError(t, err)
	defer r.Close()
	c := &recording{Constraint: grammar.NewTokenMatcher(grammar.JSON(), m.Tokenizer), maskErr: errors.New("boom")}
	_, err = r.Generate(context.Background(), "hi", WithMaxTokens(4), WithConstraint(c))
	assert.ErrorContains(t, err, "llm: constraint: boom")

	// the constraint's error stays in the chain
	c.maskErr = grammar.ErrNoToken
	_, err = r.Generate(context.Background(), "hi", WithMaxTokens(4), WithConstraint(c))
	assert.ErrorIs(t, err, grammar.ErrNoToken)

	_, err = r.Generate(context.Background(), "hi", WithMaxTokens(4), WithConstraint(grammar.NewTokenMatcher(grammar.JSON(), m.Tokenizer)),
		WithStrategy(&plainStrategy{}))
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
}
