package llm

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/llm/synth"
)

func actModel(t *testing.T, act string) *Model {
	t.Helper()
	s, err := synth.Preset("llama", "260K", core.F32, 11)
	require.NoError(t, err)
	s.Activation = act
	path := filepath.Join(t.TempDir(), act+".gguf")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, synth.Write(f, s))
	require.NoError(t, f.Close())
	m, err := Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// ReLU-family FFNs run on the reference and on the neon plugin with the same logits, and each
// activation gives different logits from the same weights (so the key is honoured).
func TestFFNActivations(t *testing.T) {
	ctx := context.Background()
	prompt := []int32{1, 300, 301, 302, 303}
	logits := map[arch.Activation][]float32{}
	for _, act := range []arch.Activation{arch.ActSiLU, arch.ActReLU, arch.ActReLU2} {
		t.Run(string(act), func(t *testing.T) {
			m := actModel(t, string(act))
			require.Equal(t, act, m.Config.Activation)
			rb := ref.New()
			defer rb.Close()
			run := func(dev core.Device) []float32 {
				r, err := NewRunner(ctx, m, dev, WithChunkSize(4), WithContextLength(32))
				require.NoError(t, err)
				defer r.Close()
				lg, err := r.Prefill(ctx, prompt)
				require.NoError(t, err)
				return append([]float32(nil), lg...)
			}
			want := run(rb.Devices()[0])
			logits[act] = want
			got := run(pluginDevices(t, "neon")[0])
			require.Len(t, got, len(want))
			for i := range want {
				require.InDelta(t, want[i], got[i], 1e-3+1e-3*float64(abs32(want[i])), "logit %d", i)
			}
		})
	}
	if len(logits) == 3 {
		assert.NotEqual(t, logits[arch.ActSiLU], logits[arch.ActReLU])
		assert.NotEqual(t, logits[arch.ActReLU], logits[arch.ActReLU2])
	}
}

func abs32(x float32) float32 {
	if x < 0 {
		return -x
	}
	return x
}
