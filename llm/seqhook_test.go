package llm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// feedHook serves Prefill and Decode through its sequence's own programs, counting the calls,
// over the runner's own cache (Attach returns none).
type feedHook struct {
	seq               *Sequence
	capacity          int64
	prefills, decodes int
}

func (h *feedHook) Attach(s *Sequence, capacity int64, _ [2]int64) ([][2]sched.Span, error) {
	h.seq, h.capacity = s, capacity
	return nil, nil
}

func (h *feedHook) Prefill(ctx context.Context, tokens []int32) ([]float32, error) {
	h.prefills++
	return h.seq.Feed(ctx, tokens, 0)
}

func (h *feedHook) Decode(ctx context.Context, token int32) ([]float32, error) {
	h.decodes++
	return h.seq.Feed(ctx, []int32{token}, 1)
}

// TestSequenceHook: a sequence hook serves the runner's Prefill and Decode (a generation through
// it gives the plain runner's tokens), and its sequence's calls check their arguments.
func TestSequenceHook(t *testing.T) {
	ctx := context.Background()
	m := openStories(t)
	dev := refDevice(t)
	opts := []RunnerOption{WithChunkSize(16), WithContextLength(64)}
	plain, err := NewRunner(ctx, m, dev, opts...)
	require.NoError(t, err)
	defer plain.Close()
	want, err := plain.Generate(ctx, "Once upon a time", WithMaxTokens(8))
	require.NoError(t, err)

	h := &feedHook{}
	r, err := NewRunner(ctx, m, dev, append(opts, WithSequenceHook(h))...)
	require.NoError(t, err)
	defer r.Close()
	require.Same(t, r, h.seq.Runner())
	assert.Equal(t, int64(64+16-1), h.capacity, "the context and a padded last chunk")
	got, err := r.Generate(ctx, "Once upon a time", WithMaxTokens(8))
	require.NoError(t, err)
	assert.Equal(t, want.Tokens, got.Tokens)
	assert.Equal(t, 1, h.prefills)
	assert.Positive(t, h.decodes)

	s := h.seq
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"prepare length 0", s.Prepare(ctx, 0), core.ErrInvalidArgument},
		{"prepare past the chunk", s.Prepare(ctx, 17), core.ErrInvalidArgument},
		{"feed an unprepared length", func() error { _, err := s.Feed(ctx, []int32{1, 2, 3}, 3); return err }(), core.ErrInvalidArgument},
		{"token outside the vocabulary", s.Check([]int32{int32(m.Config.Vocab)}), core.ErrInvalidArgument},
		{"past the context", s.Check(make([]int32, 64)), ErrContextFull},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.ErrorIs(t, tc.err, tc.want) })
	}
	n := r.Len()
	require.NoError(t, s.Prepare(ctx, 3))
	_, err = s.Feed(ctx, []int32{1, 2, 3}, 3)
	require.NoError(t, err)
	assert.Equal(t, n+3, r.Len())
	s.Commit([]int32{4})
	assert.Equal(t, []int32{1, 2, 3, 4}, r.Tokens()[n:], "Commit records tokens the hook ran")

	_, err = NewRunner(ctx, m, dev, WithSequenceHook(&feedHook{}), WithVerifyHook(chainHook{lengths: []int{2}}))
	assert.ErrorIs(t, err, core.ErrUnsupported, "a sequence hook refuses verify lengths")
}
