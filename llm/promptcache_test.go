package llm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// WithPromptCache keeps the prefix a prompt shares with the cache and feeds the rest: the
// greedy answer is what a fresh prefill gives, and CachedTokens is that prefix (all but the last
// token of a prompt the cache holds whole).
func TestPromptCacheReusesPrefix(t *testing.T) {
	ctx := context.Background()
	m := openStories(t)
	cached, err := NewRunner(ctx, m, refDevice(t))
	require.NoError(t, err)
	defer cached.Close()
	fresh, err := NewRunner(ctx, m, refDevice(t))
	require.NoError(t, err)
	defer fresh.Close()
	tok := m.Tokenizer
	for _, tc := range []struct {
		name, prompt string
		// least: the fewest tokens reused (-1: all but the last)
		least int
	}{
		{"empty cache", "Once upon a time, there was a little girl named Lily.", 0},
		{"extends the last", "Once upon a time, there was a little girl named Lily. She liked to play.", 10},
		{"same again", "Once upon a time, there was a little girl named Lily. She liked to play.", -1},
		{"shares a beginning", "Once upon a time, there was a big dog.", 5},
		{"shares nothing but BOS", "Tom had a red ball.", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids := tok.Encode(tc.prompt, true)
			want := min(cached.CachedPrefix(ids), len(ids)-1)
			got, err := cached.Generate(ctx, tc.prompt, WithMaxTokens(8), WithPromptCache())
			require.NoError(t, err)
			ref, err := fresh.Generate(ctx, tc.prompt, WithMaxTokens(8))
			require.NoError(t, err)
			assert.Equal(t, want, got.CachedTokens)
			if tc.least < 0 {
				assert.Equal(t, len(ids)-1, got.CachedTokens)
			} else {
				assert.GreaterOrEqual(t, got.CachedTokens, tc.least)
			}
			assert.Equal(t, len(ids), got.CachedTokens+got.PromptTokens, "cached and fed make the prompt")
			assert.Equal(t, ref.Tokens, got.Tokens, "the cache changes nothing in the answer")
			assert.Zero(t, ref.CachedTokens)
			assert.Equal(t, append(ids, got.Tokens[:len(got.Tokens)-1]...), cached.Tokens())
		})
	}
}
