package arch

import (
	"bytes"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
)

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

// llamaFile is a llama GGUF of metadata only: the keys ConfigFromGGUF requires, each of kvs
// replacing the key of its name or added.
func llamaFile(t *testing.T, kvs ...gguf.KeyValue) *gguf.File {
	t.Helper()
	base := []gguf.KeyValue{
		{Key: "general.architecture", Value: gguf.MustValue("llama")},
		{Key: "llama.embedding_length", Value: gguf.MustValue(uint32(64))},
		{Key: "llama.block_count", Value: gguf.MustValue(uint32(1))},
		{Key: "llama.feed_forward_length", Value: gguf.MustValue(uint32(128))},
		{Key: "llama.attention.head_count", Value: gguf.MustValue(uint32(4))},
	}
	for _, kv := range kvs {
		i := slices.IndexFunc(base, func(b gguf.KeyValue) bool { return b.Key == kv.Key })
		if i < 0 {
			base = append(base, kv)
		} else {
			base[i] = kv
		}
	}
	f, err := gguf.Parse(writeGGUF(t, base))
	require.NoError(t, err)
	return f
}

func TestLookupKnowsEveryArchitecture(t *testing.T) {
	names := Architectures()
	require.NotEmpty(t, names)
	assert.IsIncreasing(t, names)
	for _, n := range names {
		b, ok := Lookup(n)
		assert.True(t, ok, n)
		assert.NotNil(t, b, n)
	}
	_, ok := Lookup("mamba")
	assert.False(t, ok)
}

func TestConfigFromGGUFRefusesWhatItCannotBuild(t *testing.T) {
	for _, c := range []struct {
		name string
		kvs  []gguf.KeyValue
		want error
	}{
		{"unknown architecture", []gguf.KeyValue{{Key: "general.architecture", Value: gguf.MustValue("mamba")}}, core.ErrUnsupported},
		{"heads not dividing dim", []gguf.KeyValue{{Key: "llama.attention.head_count", Value: gguf.MustValue(uint32(5))}}, core.ErrInvalidArgument},
		{"odd rope dims", []gguf.KeyValue{{Key: "llama.rope.dimension_count", Value: gguf.MustValue(uint32(7))}}, core.ErrInvalidArgument},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ConfigFromGGUF(llamaFile(t, c.kvs...))
			require.ErrorIs(t, err, c.want)
		})
	}
}

func TestConfigLayerQueries(t *testing.T) {
	c := Config{SlidingWindow: 8, SWAPattern: 3, NoRopeStep: 4, RopeBase: 1e6, RopeFreqScale: 0.5,
		LocalRopeBase: 1e4, LocalRopeFreqScale: 1, HeadDim: 16}
	for _, l := range []struct {
		l               int
		sliding, rotate bool
		base, scale     float32
	}{
		{0, true, true, 1e4, 1}, {1, true, true, 1e4, 1}, {2, false, true, 1e6, 0.5}, {3, true, false, 1e4, 1},
	} {
		assert.Equal(t, l.sliding, c.Sliding(l.l), "sliding %d", l.l)
		assert.Equal(t, l.rotate, c.Rotates(l.l), "rotates %d", l.l)
		base, scale := c.RopeOf(l.l)
		assert.Equal(t, [2]float32{l.base, l.scale}, [2]float32{base, scale}, "rope %d", l.l)
	}
	o := c.AttentionOptions(0, 64)
	assert.Equal(t, int64(8), o.Window)
	assert.InDelta(t, 0.25, o.Scale, 1e-7, "1/√head_dim")
	assert.Zero(t, c.AttentionOptions(0, 8).Window, "a window as wide as the cache hides nothing")
	assert.Zero(t, c.AttentionOptions(2, 64).Window, "a global layer")
}

func TestRopeTables(t *testing.T) {
	c := Config{RopeDims: 4, RopeBase: 100, RopeFreqScale: 1, RopeFreqFactors: []float32{1, 2},
		RopeFactorsLong: []float32{4, 4}, RopeOrigContext: 16, RopeAttnFactor: 2}
	cos, sin := c.RopeTables([]int32{0, 3}, 16)
	require.Len(t, cos, 4)
	// position 0: no rotation, magnitude the attention factor
	assert.Equal(t, []float32{2, 2}, cos[:2])
	assert.Equal(t, []float32{0, 0}, sin[:2])
	// position 3, frequency 1 (θ = 3·100^(−2/4)/2 = 0.15)
	assert.InDelta(t, 2*math.Cos(0.15), cos[3], 1e-6)
	assert.InDelta(t, 2*math.Sin(0.15), sin[3], 1e-6)
	long, _ := c.RotationTables([]int32{3}, 32, 1)
	assert.InDelta(t, math.Cos(0.75), long[0], 1e-6, "past the original context: the long factors, magnitude 1")
}
