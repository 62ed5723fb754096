package quant

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/synth"
)

// synthFile writes a small synthetic llama in dt with every row 256 wide, so that the K-quants
// fit.
func synthFile(t *testing.T, dt core.DType, layers int) *gguf.File {
	t.Helper()
	spec := synth.Spec{Arch: "llama", Name: "kq-test", Dim: 256, Layers: layers, Heads: 4, KVHeads: 1, FFN: 256,
		Context: 64, Vocab: 260, Type: dt, Seed: 1}
	f, err := synth.Parse(spec)
	require.NoError(t, err)
	return f
}

// shapeFile is a llama-shaped GGUF with all-zero F32 tensors: what planning reads (names and
// shapes), written without generating weights.
func shapeFile(t *testing.T, layers int) *gguf.File {
	t.Helper()
	const d, kv, ff, vocab = 256, 64, 512, 300
	var ts []gguf.WriteTensor
	add := func(name string, shape ...int64) {
		sh := core.Shape(shape)
		ts = append(ts, gguf.WriteTensor{Name: name, DType: core.F32, Shape: sh, Data: make([]byte, 4*sh.NumElements())})
	}
	add("token_embd.weight", vocab, d)
	for l := 0; l < layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		add(p+"attn_norm.weight", d)
		add(p+"attn_q.weight", d, d)
		add(p+"attn_k.weight", kv, d)
		add(p+"attn_v.weight", kv, d)
		add(p+"attn_output.weight", d, d)
		add(p+"ffn_norm.weight", d)
		add(p+"ffn_gate.weight", ff, d)
		add(p+"ffn_up.weight", ff, d)
		add(p+"ffn_down.weight", d, ff)
	}
	add("output_norm.weight", d)
	add("output.weight", vocab, d)
	var buf bytes.Buffer
	require.NoError(t, gguf.Write(&buf, nil, ts))
	f, err := gguf.Parse(buf.Bytes())
	require.NoError(t, err)
	return f
}

// TestPlanQ4KM checks llama.cpp's Q4_K_M mix on an 8-layer model: use_more_bits(i, 8) picks
// layers 0, 3, 6 and 7 for Q6_K attn_v and ffn_down; the output head is Q6_K; the rest Q4_K.
func TestPlanQ4KM(t *testing.T) {
	f := shapeFile(t, 8)
	r, err := ParseRecipe("Q4_K_M")
	require.NoError(t, err)
	plans, err := Plan(f, r, false)
	require.NoError(t, err)
	want := map[string]core.DType{
		"token_embd.weight": core.Q4_K, "output.weight": core.Q6_K, "output_norm.weight": core.F32,
	}
	for l := 0; l < 8; l++ {
		more := core.Q4_K
		if l == 0 || l == 3 || l == 6 || l == 7 {
			more = core.Q6_K
		}
		p := fmt.Sprintf("blk.%d.", l)
		want[p+"attn_v.weight"], want[p+"ffn_down.weight"] = more, more
		for _, n := range []string{"attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"} {
			want[p+n+".weight"] = core.Q4_K
		}
		want[p+"attn_norm.weight"], want[p+"ffn_norm.weight"] = core.F32, core.F32
	}
	require.Len(t, plans, len(want))
	for _, p := range plans {
		assert.Equal(t, want[p.Name], p.To, p.Name)
		assert.Empty(t, p.Fallback, p.Name)
	}
}

func TestUseMoreBitsMatchesLlamaCpp(t *testing.T) {
	// llama.cpp's Q4_K_M attn_v/ffn_down layers for common depths (from its rule, by hand).
	for n, want := range map[int][]int{
		5:  {2, 4},
		16: {0, 1, 4, 7, 10, 13, 14, 15},
		22: {0, 1, 4, 7, 10, 13, 16, 19, 20, 21},
	} {
		var got []int
		for i := 0; i < n; i++ {
			if useMoreBits(i, n) {
				got = append(got, i)
			}
		}
		assert.Equal(t, want, got, "n_layer %d", n)
	}
}

// TestQuantizeModelWritesThePlan: the written file holds each tensor in its planned dtype, with
// the bytes core.Quantize gives for the original values, and the progress callback sees every
// tensor in order.
func TestQuantizeModelWritesThePlan(t *testing.T) {
	f := synthFile(t, core.F16, 2)
	r, err := ParseRecipe("q5_k_m")
	require.NoError(t, err)
	plans, err := Plan(f, r, false)
	require.NoError(t, err)
	var buf bytes.Buffer
	var seen []int
	sum, err := Model(context.Background(), &buf, f, r, WithProgress(func(done, total int, p TensorPlan) {
		require.Equal(t, len(plans), total)
		seen = append(seen, done)
	}))
	require.NoError(t, err)
	require.Len(t, seen, len(plans)+1)
	assert.Equal(t, len(plans), seen[len(seen)-1])
	g, err := gguf.Parse(buf.Bytes())
	require.NoError(t, err)
	ft, ok := g.Get("general.file_type")
	require.True(t, ok)
	assert.Equal(t, uint32(17), ft.Any())
	// Q6_K: the output head, and attn_v and ffn_down of layer 1 (use_more_bits(1, 2)); F32: the
	// 5 norms.
	assert.Equal(t, map[core.DType]int{core.Q6_K: 3, core.Q5_K: 13, core.F32: 5}, sum.Tensors)
	assert.Equal(t, 16, sum.Quantized)
	assert.Zero(t, sum.Fallbacks)
	for i, p := range plans {
		ti := &g.Tensors[i]
		require.Equal(t, p.Name, ti.Name)
		require.Equal(t, p.To, ti.DType, p.Name)
		if p.To == p.From {
			assert.Equal(t, f.TensorData(&f.Tensors[i]), g.TensorData(ti), p.Name)
			continue
		}
		xs, err := core.Dequantize(p.From, f.TensorData(&f.Tensors[i]), 0)
		require.NoError(t, err)
		want, err := core.Quantize(p.To, xs, 0)
		require.NoError(t, err)
		assert.Equal(t, want, g.TensorData(ti), p.Name)
	}
}

func TestQuantizeRequantizeNeedsConsent(t *testing.T) {
	f := synthFile(t, core.Q8_0, 1)
	r, err := ParseRecipe("q4_k_m")
	require.NoError(t, err)
	_, err = Plan(f, r, false)
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "already q8_0")
	plans, err := Plan(f, r, true)
	require.NoError(t, err)
	for _, p := range plans {
		if p.Name == "output.weight" {
			assert.Equal(t, core.Q6_K, p.To)
		}
	}

	_, err = ParseRecipe("q4_k_xl")
	require.ErrorIs(t, err, core.ErrInvalidArgument)
}

// On stories260K no row is a multiple of 256: every matrix falls back, to Q8_0 (rows of 64;
// llama.cpp would pick Q5_0 there, which the op set lacks), and ffn_down (rows of 172) stays F32.
func TestQuantizeStoriesQ4KMFallsBack(t *testing.T) {
	f, err := gguf.Open(storiesPath(t))
	require.NoError(t, err)
	defer f.Close()
	r, err := ParseRecipe("q4_k_m")
	require.NoError(t, err)
	plans, err := Plan(f, r, false)
	require.NoError(t, err)
	for _, p := range plans {
		switch {
		case len(p.Shape) == 1:
			assert.Equal(t, core.F32, p.To, p.Name)
		case p.Shape[1] == 172:
			assert.Equal(t, core.F32, p.To, p.Name)
			assert.Contains(t, p.Fallback, "172", p.Name)
		default:
			assert.Equal(t, core.Q8_0, p.To, p.Name)
		}
	}
}

// storiesPath is the shared test model, or a skip where it is absent.
func storiesPath(t *testing.T) string {
	t.Helper()
	p := filepath.Join("..", "..", "..", "shared", "models", "stories260K.gguf")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("test model absent (%s): %v", p, err)
	}
	return p
}

// TestNMSE: the ratio of the squared error to the reference's energy, with the edge cases of an
// all-zero reference.
func TestNMSE(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want []float32
		nmse      float64
	}{
		{"equal", []float32{1, -2, 3}, []float32{1, -2, 3}, 0},
		{"off by one in one of two", []float32{1, 3}, []float32{1, 2}, 1.0 / 5},
		{"both zero", []float32{0, 0}, []float32{0, 0}, 0},
		{"only the reference zero", []float32{1, 0}, []float32{0, 0}, math.Inf(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.nmse, NMSE(tc.got, tc.want))
		})
	}
}
