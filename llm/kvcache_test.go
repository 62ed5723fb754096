package llm

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/quant"
	"github.com/xpuhub/xpu/llm/sample"
	"github.com/xpuhub/xpu/llm/synth"
)

// kvModel is a small generated llama whose heads are 32 wide: one Q8_0/Q4_0 block each, which
// a quantized KV cache needs (stories260K's are 8 wide).
func kvModel(t testing.TB) *Model {
	t.Helper()
	s := synth.Spec{Arch: "llama", Name: "kv32", Dim: 128, Layers: 3, Heads: 4, KVHeads: 2, FFN: 256,
		Vocab: 512, Context: 256, Type: core.F32, Seed: 5}
	path := filepath.Join(t.TempDir(), "kv32.gguf")
	require.NoError(t, synth.WriteFile(path, s))
	m, err := Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// kvLogits prefills ids with K and V caches of dtypes k and v and decodes steps tokens, the
// greedy choice each time or, when feed is given, feed's tokens (teacher forcing, so that every
// cache type is compared on the same sequence). It returns every step's logits (the
// prefill's first), the tokens fed and the runner's cache memory.
func kvLogits(t *testing.T, m *Model, dev core.Device, ids []int32, steps int, k, v core.DType, feed []int32) ([][]float32, []int32, int64) {
	t.Helper()
	ctx := context.Background()
	r, err := NewRunner(ctx, m, dev, WithKVCacheTypes(k, v), WithChunkSize(16), WithContextLength(len(ids)+steps+1))
	require.NoError(t, err)
	defer r.Close()
	gotK, gotV := r.KVCacheTypes()
	require.Equal(t, [2]core.DType{k, v}, [2]core.DType{gotK, gotV})
	l, err := r.Prefill(ctx, ids)
	require.NoError(t, err)
	out := [][]float32{l}
	var fed []int32
	for i := range steps {
		next := sample.Argmax(l)
		if feed != nil {
			next = feed[i]
		}
		fed = append(fed, next)
		l, err = r.Decode(ctx, next)
		require.NoError(t, err)
		out = append(out, l)
	}
	kb, vb := r.KVCacheBytes()
	return out, fed, kb + vb
}

// TestKVCacheTypesLogits: every KV cache dtype changes the logits only by its rounding of K
// and V, F16 least and Q4_0 most, and takes the memory its blocks say (Q8_0 about half of F16,
// Q4_0 about a quarter). The logits NMSE against an F32 cache is logged (the report's figures).
func TestKVCacheTypesLogits(t *testing.T) {
	m := kvModel(t)
	ids := make([]int32, 40)
	for i := range ids {
		ids[i] = int32(3 + (i*37)%500)
	}
	ids[0] = 1
	const steps = 8
	dev := refDevice(t)
	want, fed, f32Bytes := kvLogits(t, m, dev, ids, steps, core.F32, core.F32, nil)
	nmse := func(got [][]float32) float64 {
		var worst float64
		for i := range want {
			worst = max(worst, quant.NMSE(got[i], want[i]))
		}
		return worst
	}
	for _, c := range []struct {
		k, v  core.DType
		bound float64
		bytes float64 // memory relative to F32
	}{
		{core.F16, core.F16, 1e-5, 0.5},
		{core.Q8_0, core.Q8_0, 1e-3, 34.0 / 128},
		{core.Q8_0, core.F16, 1e-3, (34.0/128 + 0.5) / 2},
		{core.Q4_0, core.Q4_0, 5e-2, 18.0 / 128},
	} {
		got, _, b := kvLogits(t, m, dev, ids, steps, c.k, c.v, fed)
		e := nmse(got)
		t.Logf("K %s, V %s: logits NMSE against F32 KV %.3g (worst of %d positions), %d bytes (%.3f of F32)",
			c.k, c.v, e, len(got), b, float64(b)/float64(f32Bytes))
		assert.Less(t, e, c.bound, "K %s V %s", c.k, c.v)
		assert.Positive(t, e, "K %s V %s: the cache must round", c.k, c.v)
		assert.InDelta(t, c.bytes, float64(b)/float64(f32Bytes), 1e-9)
	}
}

func TestKVCacheTypeErrors(t *testing.T) {
	m := openStories(t)
	for _, o := range []RunnerOption{WithKVCacheType(core.Q8_0), WithKVCacheTypes(core.F16, core.Q4_0), WithKVCacheType(core.I8)} {
		_, err := NewRunner(context.Background(), m, refDevice(t), o, WithContextLength(32))
		assert.ErrorIs(t, err, core.ErrInvalidArgument)
	}
	r, err := NewRunner(context.Background(), m, refDevice(t), WithContextLength(32))
	require.NoError(t, err)
	defer r.Close()
	k, v := r.KVCacheTypes()
	assert.Equal(t, [2]core.DType{core.F16, core.F16}, [2]core.DType{k, v}, "F16 is the default")
}

// TestKVCacheTypesLogitsFile is TestKVCacheTypesLogits' table for the model file
// XPU_KV_MODEL (skipped without it) on the backend XPU_KV_BACKEND (default ref): the logits
// NMSE of each KV cache dtype against an F32 cache over a 64-token prompt and 16 steps teacher-forced with the F32 cache's greedy tokens.
//
//	xpu gen-model --params 1B --type q4_0 -o /tmp/1b.gguf
//	XPU_KV_MODEL=/tmp/1b.gguf XPU_KV_BACKEND=neon go test ./llm -run TestKVCacheTypesLogitsFile -v
func TestKVCacheTypesLogitsFile(t *testing.T) {
	path := os.Getenv("XPU_KV_MODEL")
	if path == "" {
		t.Skip("XPU_KV_MODEL names no model file")
	}
	m, err := Open(path)
	require.NoError(t, err)
	defer m.Close()
	dev := refDevice(t)
	if b := os.Getenv("XPU_KV_BACKEND"); b != "" && b != "ref" {
		dev = pluginDevices(t, b)[0]
	}
	ids := m.Tokenizer.Encode(storyPrompt+" "+storyPrompt, true)
	for len(ids) < 64 {
		ids = append(ids, ids[1:]...)
	}
	ids = ids[:64]
	const steps = 16
	want, fed, f32Bytes := kvLogits(t, m, dev, ids, steps, core.F32, core.F32, nil)
	var f16 [][]float32
	stat := func(got, want [][]float32) (mean, worst float64) {
		for i := range want {
			e := quant.NMSE(got[i], want[i])
			worst, mean = max(worst, e), mean+e/float64(len(want))
		}
		return mean, worst
	}
	for _, c := range [][2]core.DType{{core.F16, core.F16}, {core.Q8_0, core.Q8_0}, {core.Q8_0, core.F16}, {core.Q4_0, core.Q4_0}} {
		if os.Getenv("XPU_KV_F16_ONLY") != "" && c[0] != core.F16 {
			continue
		}
		got, _, b := kvLogits(t, m, dev, ids, steps, c[0], c[1], fed)
		if f16 == nil {
			f16 = got
		}
		mean, worst := stat(got, want)
		m16, w16 := stat(got, f16)
		t.Logf("K %s, V %s: logits NMSE against F32 KV: mean %.3g, worst %.3g; against F16 KV: mean %.3g, worst %.3g (%d positions); KV %.1f MiB (%.3f of F32)",
			c[0], c[1], mean, worst, m16, w16, len(want), float64(b)/(1<<20), float64(b)/float64(f32Bytes))
	}
}

// TestDefaultKVFallsBackToF32: a device that refuses an F16 cache (the QNN CPU backend has no
// FLOAT_16 ops; its emulated profile here) gets an F32 one when the caller chose no dtype, and
// refuses when the caller asked for F16.
func TestDefaultKVFallsBackToF32(t *testing.T) {
	t.Setenv("XPU_QNN_EMU_PROFILE", "cpu")
	dev := pluginDevices(t, "qnn")[0]
	if dev.Info().Caps.Has(core.CapFP16) {
		t.Skip("the qnn device runs FLOAT_16: nothing to fall back from")
	}
	ctx := context.Background()
	m := openStories(t)
	r, err := NewRunner(ctx, m, dev, WithContextLength(32), WithChunkSize(8))
	require.NoError(t, err)
	defer r.Close()
	k, v := r.KVCacheTypes()
	assert.Equal(t, [2]core.DType{core.F32, core.F32}, [2]core.DType{k, v})
	_, err = r.Prefill(ctx, m.Tokenizer.Encode("Once upon a time", true))
	require.NoError(t, err)

	_, err = NewRunner(ctx, m, dev, WithContextLength(32), WithChunkSize(8), WithKVCacheType(core.F16))
	assert.ErrorIs(t, err, core.ErrUnsupported)
}
