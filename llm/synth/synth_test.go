package synth

import (
	"bytes"
	"context"
	"math/rand/v2"
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

// A ReLU model and its SiLU twin of the same seed and sparsity hold identical tensors (only the
// activation key differs), so llama.cpp can run the twin; sparse shaping itself changes them.
func TestActivationTwinHasIdenticalTensors(t *testing.T) {
	s := Spec{Arch: "llama", Name: "t", Dim: 128, Layers: 2, Heads: 4, KVHeads: 2, FFN: 256, Vocab: 512,
		Context: 64, Type: core.Q4_0, Seed: 3, Sparsity: 0.9, Skew: "zipf"}
	relu, silu := s, s
	relu.Activation, silu.Activation = "relu", "silu"
	fr, err := gguf.Parse(write(t, relu))
	require.NoError(t, err)
	fs, err := gguf.Parse(write(t, silu))
	require.NoError(t, err)
	require.Equal(t, len(fr.Tensors), len(fs.Tensors))
	for i := range fr.Tensors {
		a, b := &fr.Tensors[i], &fs.Tensors[i]
		require.Equal(t, a.Name, b.Name)
		require.Equal(t, fr.TensorData(a), fs.TensorData(b), a.Name)
	}
	v, ok := fr.Get("llama.feed_forward_activation")
	require.True(t, ok)
	assert.Equal(t, "relu", v.Any())
	_, ok = fs.Get("llama.feed_forward_activation")
	assert.False(t, ok)
	plain := s
	plain.Sparsity = 0
	fp, err := gguf.Parse(write(t, plain))
	require.NoError(t, err)
	g, _ := fp.Tensor("blk.0.ffn_gate.weight")
	gr, _ := fr.Tensor("blk.0.ffn_gate.weight")
	assert.NotEqual(t, fp.TensorData(g), fr.TensorData(gr))
}

func TestFiringProbabilities(t *testing.T) {
	for _, skew := range []string{"zipf", "uniform"} {
		p, err := FiringProbabilities(1000, 0.1, skew, rand.New(rand.NewPCG(1, 1)))
		require.NoError(t, err)
		var sum, mx float64
		for _, v := range p {
			sum += v
			mx = max(mx, v)
		}
		assert.InDelta(t, 0.1, sum/1000, 1e-3, skew)
		if skew == "zipf" {
			assert.InDelta(t, 0.99, mx, 1e-9)
		} else {
			assert.InDelta(t, 0.1, mx, 1e-9)
		}
	}
	_, err := FiringProbabilities(10, 1.5, "zipf", rand.New(rand.NewPCG(1, 1)))
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	_, err = FiringProbabilities(10, 0.5, "pareto", rand.New(rand.NewPCG(1, 1)))
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
}
