package llm

import (
	"bytes"
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/quant"
	"github.com/xpuhub/xpu/llm/synth"
)

// A Q4_K_M model runs as MATMUL weights and a GET_ROWS table in their K-quant dtypes and gives
// the logits of its twin whose every tensor is the same values decoded to F32: the reference
// decodes both exactly, so any difference is a wiring error (a wrong row, scale or layout).
func TestKQuantModelMatchesItsDequantizedTwin(t *testing.T) {
	// Every row is 256 wide, so that the K-quants fit.
	spec := synth.Spec{Arch: "llama", Name: "kq-test", Dim: 256, Layers: 2, Heads: 4, KVHeads: 1, FFN: 256,
		Context: 64, Vocab: 260, Type: core.F32, Seed: 1}
	var fb bytes.Buffer
	require.NoError(t, synth.Write(&fb, spec))
	f, err := gguf.Parse(fb.Bytes())
	require.NoError(t, err)
	r, err := quant.ParseRecipe("q4_k_m")
	require.NoError(t, err)
	var qb bytes.Buffer
	_, err = quant.Model(context.Background(), &qb, f, r)
	require.NoError(t, err)
	qf, err := gguf.Parse(qb.Bytes())
	require.NoError(t, err)
	qm, err := FromFile(qf)
	require.NoError(t, err)
	assert.Equal(t, core.Q4_K, qm.weights["token_embd.weight"].dtype)
	assert.Equal(t, core.Q4_K, qm.weights["blk.0.attn_q.weight"].dtype)
	assert.Equal(t, core.Q6_K, qm.weights["output.weight"].dtype)

	var ts []gguf.WriteTensor
	for i := range qf.Tensors {
		ti := &qf.Tensors[i]
		xs, err := core.Dequantize(ti.DType, qf.TensorData(ti), 0)
		require.NoError(t, err)
		ts = append(ts, gguf.WriteTensor{Name: ti.Name, DType: core.F32, Shape: ti.Shape, Data: core.EncodeF32(xs)})
	}
	var tb bytes.Buffer
	require.NoError(t, gguf.Write(&tb, qf.KV, ts))
	tf, err := gguf.Parse(tb.Bytes())
	require.NoError(t, err)
	twin, err := FromFile(tf)
	require.NoError(t, err)

	dev := refDevice(t)
	ids := []int32{1, 70, 5, 200}
	want, got := decodeLogits(t, twin, dev, ids), decodeLogits(t, qm, dev, ids)
	for i := range want {
		require.Len(t, got[i], len(want[i]))
		for j := range want[i] {
			require.InDelta(t, want[i][j], got[i][j], 1e-5*math.Max(1, math.Abs(float64(want[i][j]))), "token %d logit %d", i, j)
		}
	}
}
