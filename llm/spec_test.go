package llm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/draft"
)

// summaryPrompt is a summary-style task: the prompt holds a story the model goes on to retell.
const summaryPrompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. " +
	"One day, she saw a big, red ball. She wanted to play with it, but it was too high. " +
	"Lily asked her mom to help her. Her mom said, \"Let's go to the park and play with the ball.\" " +
	"Lily was so happy. She played with the ball all day long. Once upon a time, there was a little girl named Lily."

// drafters are every drafter, fresh for each generation.
func drafters(t *testing.T) map[string]func() draft.Drafter {
	return map[string]func() draft.Drafter{
		"lookup":    func() draft.Drafter { return draft.NewLookup() },
		"retrieval": func() draft.Drafter { return draft.NewRetrieval(draft.RetrievalOptions{}) },
		"retrieval no calibration or reuse": func() draft.Drafter {
			return draft.NewRetrieval(draft.RetrievalOptions{CalibrateTopK: -1, NoReuse: true})
		},
	}
}

func specRunner(t *testing.T, m *Model, dev core.Device, opts ...RunnerOption) *Runner {
	r, err := NewRunner(context.Background(), m, dev, append([]RunnerOption{WithVerifyLengths(8, 16, 32), WithChunkSize(16)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func TestSpecGreedyIdentical(t *testing.T) {
	m := openStories(t)
	r := specRunner(t, m, refDevice(t))
	ctx := context.Background()
	for _, prompt := range []string{"", summaryPrompt, "Tom and his dog", "Lily"} {
		plain, err := r.Generate(ctx, prompt, WithMaxTokens(256))
		require.NoError(t, err)
		for name, mk := range drafters(t) {
			for _, always := range []bool{false, true} {
				var o []SpecOption
				if always {
					o = append(o, SpecAlways())
				}
				res, err := r.Generate(ctx, prompt, WithMaxTokens(256), WithSpeculative(mk(), o...))
				require.NoError(t, err, name)
				require.Equal(t, plain.Text, res.Text, "%s always=%v prompt %q", name, always, prompt)
				require.Equal(t, plain.Tokens, res.Tokens)
				require.Equal(t, plain.Stop, res.Stop)
				t.Logf("%s always=%v prompt %.10q: %s", name, always, prompt, res.Spec)
			}
		}
	}
}
