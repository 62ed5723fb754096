package synth

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/gguf"
)

func write(t *testing.T, s Spec) []byte {
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, s))
	return buf.Bytes()
}

func TestGeneratedModelsLoadAndRun(t *testing.T) {
	for _, c := range []struct{ arch, size string }{{"llama", "260K"}, {"qwen2", "260K"}} {
		for _, dt := range []core.DType{core.F32, core.Q8_0, core.Q4_0} {
			t.Run(c.arch+"/"+dt.String(), func(t *testing.T) {
				s, err := Preset(c.arch, c.size, dt, 7)
				require.NoError(t, err)
				data := write(t, s)
				f, err := gguf.Parse(data)
				require.NoError(t, err)
				m, err := llm.FromFile(f)
				require.NoError(t, err)
				assert.Equal(t, c.arch, m.Config.Arch)
				assert.Equal(t, 512, m.Config.Vocab)
				ft, _ := f.Get("general.file_type")
				assert.Equal(t, fileType(dt), ft.Any())

				b := ref.New()
				defer b.Close()
				r, err := llm.NewRunner(context.Background(), m, b.Devices()[0], llm.WithChunkSize(4), llm.WithContextLength(32))
				require.NoError(t, err)
				defer r.Close()
				res, err := r.Generate(context.Background(), "hello world", llm.WithMaxTokens(8))
				require.NoError(t, err)
				// (len(Tokens)+len(Stop) was never zero: Stop is always set.) A random model
				// rarely samples EOS, so it runs to the budget, each token inside the vocabulary.
				require.Equal(t, llm.StopMaxTokens, res.Stop, "tokens %v", res.Tokens)
				require.Len(t, res.Tokens, 8)
				for _, id := range res.Tokens {
					assert.True(t, id >= 0 && int(id) < s.Vocab, "token %d", id)
				}
				assert.Positive(t, res.PromptTokens)
			})
		}
	}
}

func TestDeterministicBySeed(t *testing.T) {
	s, err := Preset("llama", "260K", core.Q4_0, 1)
	require.NoError(t, err)
	a, b := write(t, s), write(t, s)
	assert.Equal(t, a, b)
	s.Seed = 2
	assert.NotEqual(t, a, write(t, s))
}

func TestPresetsAndErrors(t *testing.T) {
	s, err := Preset("llama", "1b", core.Q4_0, 0)
	require.NoError(t, err)
	assert.InDelta(t, 1e9, float64(s.Params()), 0.1e9)
	_, err = Preset("llama", "13B", core.Q4_0, 0)
	assert.ErrorIs(t, err, core.ErrNotFound)
	_, err = Preset("gpt2", "1B", core.Q4_0, 0)
	assert.ErrorIs(t, err, core.ErrUnsupported)
	_, err = Preset("llama", "1B", core.I8, 0)
	assert.ErrorIs(t, err, core.ErrUnsupported)
	bad := Spec{Arch: "llama", Dim: 48, Layers: 1, Heads: 2, KVHeads: 1, FFN: 64, Vocab: 300, Context: 8, Type: core.Q8_0}
	assert.ErrorIs(t, Write(&bytes.Buffer{}, bad), core.ErrInvalidArgument)
}
