package sparse

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/llm"
)

// The Go forward pass gives the runtime's logits (reference backend) for a ReLU model, so the
// activations the planner profiles are the ones the runtime computes.
func TestForwardMatchesRunner(t *testing.T) {
	ctx := context.Background()
	m, _ := tinyModel(t, t.TempDir(), core.Q8_0, 3)
	toks := []int32{1, 300, 301, 302, 303, 350, 400}
	layers := 0
	got, err := Forward(ctx, m, toks, func(l int, x, gate []float32) error {
		require.Len(t, x, len(toks)*m.Config.Dim)
		require.Len(t, gate, len(toks)*m.Config.FFN)
		layers++
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, m.Config.Layers, layers)
	b := ref.New()
	defer b.Close()
	r, err := llm.NewRunner(ctx, m, b.Devices()[0], llm.WithChunkSize(4), llm.WithContextLength(32))
	require.NoError(t, err)
	defer r.Close()
	want, err := r.Prefill(ctx, toks)
	require.NoError(t, err)
	require.Len(t, got, len(want))
	for i := range want {
		require.InDelta(t, want[i], got[i], 2e-3, "logit %d", i)
	}
}
