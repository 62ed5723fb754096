package llm

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/llm/gguf"
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
	logits := map[Activation][]float32{}
	for _, act := range []Activation{ActSiLU, ActReLU, ActReLU2} {
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
		assert.NotEqual(t, logits[ActSiLU], logits[ActReLU])
		assert.NotEqual(t, logits[ActReLU], logits[ActReLU2])
	}
}

func abs32(x float32) float32 {
	if x < 0 {
		return -x
	}
	return x
}

func TestActivationKey(t *testing.T) {
	base := func(v any) *gguf.File {
		kvs := []gguf.KeyValue{
			{Key: "general.architecture", Value: gguf.MustValue("llama")},
			{Key: "llama.embedding_length", Value: gguf.MustValue(uint32(64))},
			{Key: "llama.block_count", Value: gguf.MustValue(uint32(1))},
			{Key: "llama.feed_forward_length", Value: gguf.MustValue(uint32(128))},
			{Key: "llama.attention.head_count", Value: gguf.MustValue(uint32(4))},
		}
		if v != nil {
			kvs = append(kvs, gguf.KeyValue{Key: "llama." + ActivationKey, Value: gguf.MustValue(v)})
		}
		f, err := gguf.Parse(writeGGUF(t, kvs))
		require.NoError(t, err)
		return f
	}
	for _, c := range []struct {
		v    any
		want Activation
		err  bool
	}{{nil, ActSiLU, false}, {"relu", ActReLU, false}, {"relu2", ActReLU2, false}, {"silu", ActSiLU, false},
		{"gelu", "", true}, {uint32(1), "", true}} {
		cfg, err := ConfigFromGGUF(base(c.v))
		if c.err {
			require.ErrorIs(t, err, core.ErrInvalidArgument, "%v", c.v)
			assert.Contains(t, err.Error(), ActivationKey)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, c.want, cfg.Activation)
		assert.Equal(t, c.want.Sparse(), c.want != ActSiLU)
	}
}

func writeGGUF(t *testing.T, kvs []gguf.KeyValue) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, gguf.Write(&b, kvs, nil))
	return b.Bytes()
}
