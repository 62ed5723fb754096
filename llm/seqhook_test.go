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
	seq               *Seam
	prefills, decodes int
}

func (h *feedHook) Attach(s *Seam) ([][2]sched.Span, error) {
	h.seq = s
	return nil, nil
}

func (h *feedHook) Prefill(ctx context.Context, tokens []int32) ([]float32, error) {
	h.prefills++
	return h.run(ctx, tokens, h.seq.Runner().ChunkSize())
}

func (h *feedHook) Decode(ctx context.Context, token int32) ([]float32, error) {
	h.decodes++
	return h.run(ctx, []int32{token}, 1)
}

// run runs tokens through the runner's own programs of chunk length c.
func (h *feedHook) run(ctx context.Context, tokens []int32, c int) ([]float32, error) {
	p, err := h.seq.Program(c)
	if err != nil {
		return nil, err
	}
	return p.Run(ctx, tokens, nil, nil, nil)
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
	assert.Equal(t, int64(64+16-1), h.seq.Capacity(), "the context and a padded last chunk")
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
		{"prepare length 0", func() error { _, err := s.Prepare(ctx, 0, false); return err }(), core.ErrInvalidArgument},
		{"prepare past the chunk", func() error { _, err := s.Prepare(ctx, 17, false); return err }(), core.ErrInvalidArgument},
		{"a length the runner lacks", func() error { _, err := s.Program(3); return err }(), core.ErrInvalidArgument},
		{"token outside the vocabulary", s.Check([]int32{int32(m.Config.Vocab)}), core.ErrInvalidArgument},
		{"past the context", s.Check(make([]int32, 64)), ErrContextFull},
		{"no tokens", s.Check(nil), core.ErrInvalidArgument},
		{"close the runner's own program", func() error {
			p, err := s.Program(1)
			require.NoError(t, err)
			return p.Close()
		}(), core.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.ErrorIs(t, tc.err, tc.want) })
	}
	n := r.Len()
	p, err := s.Prepare(ctx, 3, false)
	require.NoError(t, err)
	assert.Equal(t, 3, p.Len())
	_, err = p.Run(ctx, []int32{1, 2, 3}, nil, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, n+3, r.Len())
	s.Commit([]int32{4})
	assert.Equal(t, []int32{1, 2, 3, 4}, r.Tokens()[n:], "Commit records tokens the hook ran")

	_, err = NewRunner(ctx, m, dev, WithSequenceHook(&feedHook{}), WithVerifyHook(chainHook{lengths: []int{2}}))
	assert.ErrorIs(t, err, core.ErrUnsupported, "a sequence hook refuses verify lengths")
}
