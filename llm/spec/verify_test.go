package spec

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/llmtest"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/draft"
	"github.com/xpuhub/xpu/llm/synth"
)

// A draft tree's mask and a sliding window do not combine in one ATTENTION: where the window
// hides keys the runner verifies chains (the causal mask) instead of trees, and where the
// context is within the window it keeps trees.
func TestTreeVerifyOverASlidingWindow(t *testing.T) {
	s, err := synth.Preset("mistral", "260K", core.F32, 7)
	require.NoError(t, err)
	s.Layers, s.Context, s.Window = 2, 64, 16
	m := llmtest.Synth(t, s)
	for _, c := range []struct {
		ctx  int
		tree bool
	}{{32, false}, {8, true}} {
		r, err := llm.NewRunner(context.Background(), m, llmtest.RefDevice(t), llm.WithContextLength(c.ctx), WithVerifyLengths(4))
		require.NoError(t, err)
		assert.Equal(t, c.tree, TreeVerify(r), "context %d", c.ctx)
		assert.Equal(t, []int{4}, VerifyLengths(r))
		require.NoError(t, r.Close())
	}
}

// Verifying on a runner without verify graphs, or a draft its graphs do not take, is an error
// that changes nothing.
func TestVerifyWithoutGraphs(t *testing.T) {
	ctx := context.Background()
	m := llmtest.Stories(t)
	plain, err := llm.NewRunner(ctx, m, llmtest.RefDevice(t), llm.WithContextLength(64))
	require.NoError(t, err)
	defer plain.Close()
	_, err = plain.Prefill(ctx, []int32{1, 2, 3})
	require.NoError(t, err)
	assert.Zero(t, MaxVerify(plain))
	assert.Nil(t, VerifyLengths(plain))
	assert.False(t, TreeVerify(plain))
	for name, call := range map[string]func() error{
		"Verify":     func() error { _, err := Verify(ctx, plain, []int32{4, 5}); return err },
		"VerifyTree": func() error { _, err := VerifyTree(ctx, plain, 4, draft.Chain([]int32{5})); return err },
		"KeepPath":   func() error { return KeepPath(ctx, plain, 1, []int{0}) },
		"no tokens":  func() error { _, err := Verify(ctx, plain, nil); return err },
	} {
		require.ErrorIs(t, call(), core.ErrInvalidArgument, name)
		assert.Equal(t, 3, plain.Len(), name)
	}
	l, err := Verify(ctx, plain, []int32{4})
	require.NoError(t, err, "one token is a decode step")
	assert.Len(t, l, 1)
}
