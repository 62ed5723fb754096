package sparse

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/synth"
)

// tinyModel writes a 260K synthetic ReLU model to dir and opens it.
func tinyModel(t testing.TB, dir string, dt core.DType, seed uint64) (*llm.Model, string) {
	t.Helper()
	s, err := synth.Preset("llama", "260K", dt, seed)
	require.NoError(t, err)
	s.Activation = "relu"
	path := filepath.Join(dir, "m.gguf")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, synth.Write(f, s))
	require.NoError(t, f.Close())
	m, err := llm.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m, path
}

// randomPlan is a plan for m with random orders and predictors (format tests only).
func randomPlan(t testing.TB, m *llm.Model, layers int) *Plan {
	t.Helper()
	c := m.Config
	h, err := ModelHash(m.File)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	const r = 4
	p := &Plan{Meta: Meta{ModelHash: h, Activation: ActReLU, Gated: true, BudgetBytes: 1 << 20, PredRank: r,
		PredThreshold: -0.25, CalibTokens: 7}, D: c.Dim, F: c.FFN}
	dt, _ := m.File.Tensor("blk.0.ffn_gate.weight")
	p.BundleType = dt.DType
	floats := func(n int) []float32 {
		xs := make([]float32, n)
		for i := range xs {
			xs[i] = float32(rng.NormFloat64())
		}
		return xs
	}
	for l := 0; l < layers; l++ {
		order := make([]int32, c.FFN)
		for i, n := range rng.Perm(c.FFN) {
			order[i] = int32(n)
		}
		b, err := BuildBundles(m, l, order)
		require.NoError(t, err)
		p.Layers = append(p.Layers, Layer{Bundle: b, Order: order, Freq: floats(c.FFN), PredA: floats(r * c.Dim),
			PredB: floats(c.FFN * r), PredBias: floats(c.FFN)})
		p.HotCounts = append(p.HotCounts, l*3)
		p.Recall = append(p.Recall, 0.9+float32(l)/100)
		p.Precision = append(p.Precision, 0.5)
	}
	return p
}

func TestSidecarRoundTrip(t *testing.T) {
	for _, dt := range []core.DType{core.F32, core.F16, core.Q8_0, core.Q4_0} {
		t.Run(dt.String(), func(t *testing.T) {
			dir := t.TempDir()
			m, mpath := tinyModel(t, dir, dt, 3)
			p := randomPlan(t, m, m.Config.Layers)
			path := DefaultPath(mpath)
			require.NoError(t, WriteFile(path, p))
			s, err := OpenFor(path, m)
			require.NoError(t, err)
			defer s.Close()
			assert.Equal(t, p.ModelHash, s.ModelHash)
			assert.Equal(t, p.HotCounts, s.HotCounts)
			assert.Equal(t, p.Recall, s.Recall)
			assert.Equal(t, p.Precision, s.Precision)
			assert.Equal(t, p.PredThreshold, s.PredThreshold)
			assert.Equal(t, p.BudgetBytes, s.BudgetBytes)
			assert.Equal(t, 7, s.CalibTokens)
			assert.Equal(t, dt, s.BundleType)
			assert.Equal(t, dt.Bytes(int64(3*m.Config.Dim)), s.RowBytes)
			for l := range p.Layers {
				assert.Equal(t, p.Layers[l].Order, s.Order(l))
				assert.Equal(t, p.Layers[l].Freq, s.Freq(l))
				assert.Equal(t, p.Layers[l].Bundle, s.Bundle(l))
				assert.Zero(t, s.BundleOffset(l)%Alignment, "layer %d bundle offset", l)
				// The predictors are stored as F16: equal to within its rounding.
				pr := s.Predictor().Layers[l]
				for i, a := range p.Layers[l].PredA {
					require.InDelta(t, a, pr.A[i], 2e-3*max(1, float64(a)))
				}
			}
			// The bundle row read at its file offset is the one the mapping shows (what a pread
			// of a cold neuron gets).
			raw, err := os.ReadFile(path)
			require.NoError(t, err)
			off := s.BundleOffset(1) + 5*s.RowBytes
			assert.Equal(t, s.Bundle(1)[5*s.RowBytes:6*s.RowBytes], raw[off:off+s.RowBytes])
		})
	}
}

// A bundle row of an F32 model is the neuron's gate row, up row and down column exactly.
func TestBundleLayoutF32(t *testing.T) {
	m, _ := tinyModel(t, t.TempDir(), core.F32, 5)
	c := m.Config
	order := make([]int32, c.FFN)
	for i := range order {
		order[i] = int32(c.FFN - 1 - i)
	}
	b, err := BuildBundles(m, 2, order)
	require.NoError(t, err)
	vals, err := core.Dequantize(core.F32, b, 0)
	require.NoError(t, err)
	deq := func(name string) []float32 {
		ti, ok := m.File.Tensor(name)
		require.True(t, ok)
		xs, err := core.Dequantize(ti.DType, m.File.TensorData(ti), 0)
		require.NoError(t, err)
		return xs
	}
	gate, up, down := deq("blk.2.ffn_gate.weight"), deq("blk.2.ffn_up.weight"), deq("blk.2.ffn_down.weight")
	D, F := c.Dim, c.FFN
	for _, i := range []int{0, 7, F - 1} {
		n := int(order[i])
		row := vals[i*3*D : (i+1)*3*D]
		assert.Equal(t, gate[n*D:(n+1)*D], row[:D])
		assert.Equal(t, up[n*D:(n+1)*D], row[D:2*D])
		for d := 0; d < D; d++ {
			require.Equal(t, down[d*F+n], row[2*D+d])
		}
	}
}

func TestSidecarErrors(t *testing.T) {
	dir := t.TempDir()
	m, mpath := tinyModel(t, dir, core.F32, 3)
	p := randomPlan(t, m, m.Config.Layers)
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, p))
	good := buf.Bytes()

	t.Run("hash mismatch", func(t *testing.T) {
		other, _ := tinyModel(t, t.TempDir(), core.F32, 4) // another seed: same shapes
		path := filepath.Join(dir, "a.sparse.gguf")
		require.NoError(t, os.WriteFile(path, good, 0o644))
		_, err := OpenFor(path, other)
		require.ErrorIs(t, err, ErrMismatch)
		assert.Contains(t, err.Error(), "hash")
	})
	t.Run("truncated", func(t *testing.T) {
		path := filepath.Join(dir, "t.sparse.gguf")
		require.NoError(t, os.WriteFile(path, good[:len(good)-Alignment-100], 0o644))
		_, err := OpenFor(path, m)
		require.ErrorIs(t, err, ErrFormat)
		assert.Contains(t, err.Error(), "truncated")
	})
	t.Run("wrong layer count", func(t *testing.T) {
		q := randomPlan(t, m, m.Config.Layers-1)
		path := filepath.Join(dir, "l.sparse.gguf")
		require.NoError(t, WriteFile(path, q))
		_, err := OpenFor(path, m)
		require.ErrorIs(t, err, ErrMismatch)
		assert.Contains(t, err.Error(), "layers")
	})
	t.Run("activation", func(t *testing.T) {
		q := *p
		q.Activation = "silu"
		assert.ErrorIs(t, Write(&bytes.Buffer{}, &q), core.ErrInvalidArgument)
	})
	t.Run("not a permutation", func(t *testing.T) {
		q := *p
		q.Layers = append([]Layer(nil), p.Layers...)
		q.Layers[1].Order = append([]int32(nil), p.Layers[1].Order...)
		q.Layers[1].Order[3] = q.Layers[1].Order[4]
		assert.ErrorIs(t, Write(&bytes.Buffer{}, &q), ErrFormat)
	})
	t.Run("version", func(t *testing.T) {
		f, err := gguf.Parse(good)
		require.NoError(t, err)
		kvs := append([]gguf.KeyValue(nil), f.KV...)
		for i := range kvs {
			if kvs[i].Key == KeyVersion {
				kvs[i].Value = gguf.MustValue(uint32(9))
			}
		}
		var ts []gguf.WriteTensor
		for i := range f.Tensors {
			ti := &f.Tensors[i]
			ts = append(ts, gguf.WriteTensor{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, Data: f.TensorData(ti)})
		}
		var b bytes.Buffer
		require.NoError(t, gguf.Write(&b, kvs, ts))
		g, err := gguf.Parse(b.Bytes())
		require.NoError(t, err)
		_, err = FromFile(g)
		assert.ErrorIs(t, err, core.ErrIncompatible)
	})
	_ = mpath
}

// FuzzFromFile: no input panics the reader, and what it accepts is self-consistent.
func FuzzFromFile(f *testing.F) {
	m, _ := tinyModel(f, f.TempDir(), core.Q8_0, 3)
	p := randomPlan(f, m, 2)
	var buf bytes.Buffer
	require.NoError(f, Write(&buf, p))
	f.Add(buf.Bytes())
	f.Add(buf.Bytes()[:200])
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := gguf.Parse(data)
		if err != nil {
			return
		}
		s, err := FromFile(g)
		if err != nil {
			return
		}
		for l := 0; l < s.Layers(); l++ {
			require.Len(t, s.Order(l), s.F)
			require.Len(t, s.Bundle(l), int(int64(s.F)*s.RowBytes))
		}
		pr := s.Predictor()
		_ = pr.Predict(0, make([]float32, s.D), nil)
	})
}
