package llm

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/sample"
)

// plainStrategy decodes as Generate's own loop does, through what a Strategy sees: enough to
// reproduce plain decoding, context shifts included.
type plainStrategy struct {
	begun, finished int
	beginErr        error
}

func (s *plainStrategy) Begin(g *Generation) error {
	s.begun++
	if s.beginErr != nil {
		return s.beginErr
	}
	g.SetReport(testReport("plain"))
	return nil
}

func (s *plainStrategy) Prefill(ctx context.Context, g *Generation, ids []int32) ([]float32, error) {
	return g.Runner().Prefill(ctx, ids)
}

func (s *plainStrategy) Decode(ctx context.Context, g *Generation, logits []float32) error {
	r := g.Runner()
	var hist []int32
	for {
		hist = r.AppendTokens(hist[:0])
		next := g.Sampler().Sample(slices.Clone(logits[:r.Model().Tokenizer.Size()]), hist)
		if done, err := g.Emit(next); done || err != nil {
			return err
		}
		if r.Len() >= r.ContextLength() {
			if !g.Shifts() {
				g.Stop(StopContext)
				return nil
			}
			if _, err := g.Shift(ctx); errors.Is(err, ErrNoShift) {
				g.Stop(StopContext)
				return nil
			} else if err != nil {
				return err
			}
		}
		var err error
		if logits, err = r.Decode(ctx, next); err != nil {
			return err
		}
	}
}

func (s *plainStrategy) Finish(*Generation, Result) { s.finished++ }

type testReport string

func (r testReport) String() string { return string(r) }

// TestStrategy: a strategy that decodes plainly through the Generation gives Generate's own
// text, tokens and stop reason, greedy and sampled; Begin's error leaves the cache as it was;
// a strategy and a constraint do not combine.
func TestStrategy(t *testing.T) {
	ctx := context.Background()
	m := openStories(t)
	r, err := NewRunner(ctx, m, refDevice(t), WithContextLength(64))
	require.NoError(t, err)
	defer r.Close()
	for _, c := range []struct {
		name string
		opts []GenerateOption
	}{
		{"greedy", nil},
		{"sampled", []GenerateOption{WithSampler(sample.Config{Temperature: 0.9, TopK: 20, Seed: 4, RepeatPenalty: 1.1})}},
		{"to the end of the context", []GenerateOption{WithMaxTokens(200)}},
		{"shifting", []GenerateOption{WithMaxTokens(200), WithContextShift(4)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := append([]GenerateOption{WithMaxTokens(40)}, c.opts...)
			want, err := r.Generate(ctx, "Lily and Tom", opts...)
			require.NoError(t, err)
			s := &plainStrategy{}
			var streamed string
			got, err := r.Generate(ctx, "Lily and Tom", append(opts, WithStrategy(s),
				WithStream(func(p string) error { streamed += p; return nil }))...)
			require.NoError(t, err)
			assert.Equal(t, want.Text, got.Text)
			assert.Equal(t, want.Tokens, got.Tokens)
			assert.Equal(t, want.Stop, got.Stop)
			assert.Equal(t, got.Text, streamed)
			assert.Equal(t, testReport("plain"), got.Strategy)
			assert.Nil(t, want.Strategy)
			assert.Equal(t, 1, s.begun)
			assert.Equal(t, 1, s.finished)
		})
	}
	t.Run("Begin's error changes nothing", func(t *testing.T) {
		before := r.Tokens()
		s := &plainStrategy{beginErr: core.ErrUnsupported}
		_, err := r.Generate(ctx, "Tom", WithStrategy(s))
		require.ErrorIs(t, err, core.ErrUnsupported)
		assert.Equal(t, before, r.Tokens())
		assert.Zero(t, s.finished)
	})
	t.Run("a stream error ends the generation without Finish", func(t *testing.T) {
		s := &plainStrategy{}
		boom := errors.New("boom")
		_, err := r.Generate(ctx, "Tom", WithStrategy(s), WithStream(func(string) error { return boom }))
		require.ErrorIs(t, err, boom)
		assert.Zero(t, s.finished)
	})
}
