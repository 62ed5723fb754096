package w8a8

import (
	"bytes"
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/synth"
)

func model(t *testing.T, dt core.DType, seed uint64) *gguf.File {
	t.Helper()
	s, err := synth.Preset("qwen2", "260K", dt, seed)
	require.NoError(t, err)
	f, err := synth.Parse(s)
	require.NoError(t, err)
	return f
}

func TestQuantizeWeight(t *testing.T) {
	xs := []float32{1, -2, 0.5, 0, 4, -4, 0.01, 3}
	for _, c := range []struct {
		name   string
		g      Granularity
		scales []float32
	}{
		{"tensor", PerTensor, []float32{4.0 / 127}},
		{"channel", PerChannel, []float32{2.0 / 127, 4.0 / 127}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, err := QuantizeWeight(xs, 2, 4, c.g)
			require.NoError(t, err)
			assert.InDeltaSlice(t, c.scales, w.Scales, 1e-9)
			back := w.Dequantize(2, 4)
			for i, x := range xs {
				s := w.Scales[0]
				if c.g == PerChannel {
					s = w.Scales[i/4]
				}
				assert.InDelta(t, x, back[i], float64(s)/2+1e-7, "value %d", i)
			}
			// the largest magnitude of each scale group lands on ±127
			assert.Equal(t, int8(-127), int8(w.Codes[5]))
		})
	}
	zero, err := QuantizeWeight(make([]float32, 4), 1, 4, PerTensor)
	require.NoError(t, err)
	assert.Equal(t, []float32{1}, zero.Scales)
	for _, bad := range []struct {
		name string
		xs   []float32
		n, k int
	}{
		{"shape", xs, 3, 4},
		{"nan", []float32{float32(math.NaN()), 1}, 1, 2},
		{"inf", []float32{float32(math.Inf(1)), 1}, 1, 2},
	} {
		_, err := QuantizeWeight(bad.xs, bad.n, bad.k, PerTensor)
		assert.ErrorIs(t, err, core.ErrInvalidArgument, bad.name)
	}
}

func TestLayoutRoundTrip(t *testing.T) {
	for _, dt := range []core.DType{core.F32, core.F16, core.Q8_0} {
		for _, g := range []Granularity{PerTensor, PerChannel} {
			t.Run(dt.String()+"/"+g.String(), func(t *testing.T) {
				f := model(t, dt, 3)
				var buf bytes.Buffer
				sum, err := WriteModel(context.Background(), &buf, f, g)
				require.NoError(t, err)
				assert.Equal(t, 5*len(Projections), sum.Matrices)
				out, err := gguf.Parse(buf.Bytes())
				require.NoError(t, err)
				has, err := HasLayout(out)
				require.NoError(t, err)
				assert.True(t, has)
				// every original tensor is kept byte for byte; the key ignores the layout
				for i := range f.Tensors {
					ot, ok := out.Tensor(f.Tensors[i].Name)
					require.True(t, ok)
					assert.Equal(t, f.TensorData(&f.Tensors[i]), out.TensorData(ot))
				}
				assert.Equal(t, ModelKey(f), ModelKey(out))
				for _, name := range ProjectionNames(f) {
					w, gg, ok, err := FromFile(out, name)
					require.NoError(t, err)
					require.True(t, ok, name)
					assert.Equal(t, g, gg)
					orig, _ := f.Tensor(name)
					xs, err := core.Dequantize(orig.DType, f.TensorData(orig), 0)
					require.NoError(t, err)
					want, err := QuantizeWeight(xs, int(orig.Shape[0]), int(orig.Shape[1]), g)
					require.NoError(t, err)
					assert.Equal(t, want, w, name)
				}
				// a file that has the layout is not converted twice
				_, err = WriteModel(context.Background(), &bytes.Buffer{}, out, g)
				assert.ErrorIs(t, err, core.ErrInvalidArgument)
			})
		}
	}
}

func TestFromFileRejectsBrokenLayouts(t *testing.T) {
	f := model(t, core.F32, 3)
	name := "blk.0.attn_q.weight"
	orig, _ := f.Tensor(name)
	codes := make([]byte, orig.Shape.NumElements())
	for _, c := range []struct {
		name string
		ts   []gguf.WriteTensor
	}{
		{"codes only", []gguf.WriteTensor{{Name: name + SuffixCodes, DType: core.I8, Shape: orig.Shape, Data: codes}}},
		{"zero scale", []gguf.WriteTensor{{Name: name + SuffixCodes, DType: core.I8, Shape: orig.Shape, Data: codes},
			{Name: name + SuffixScale, DType: core.F32, Shape: core.Shape{1}, Data: core.EncodeF32([]float32{0})}}},
		{"scale length", []gguf.WriteTensor{{Name: name + SuffixCodes, DType: core.I8, Shape: orig.Shape, Data: codes},
			{Name: name + SuffixScale, DType: core.F32, Shape: core.Shape{3}, Data: core.EncodeF32([]float32{1, 1, 1})}}},
		{"codes dtype", []gguf.WriteTensor{{Name: name + SuffixCodes, DType: core.F32, Shape: orig.Shape, Data: make([]byte, 4*len(codes))},
			{Name: name + SuffixScale, DType: core.F32, Shape: core.Shape{1}, Data: core.EncodeF32([]float32{1})}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts := []gguf.WriteTensor{{Name: name, DType: orig.DType, Shape: orig.Shape, Data: f.TensorData(orig)}}
			var buf bytes.Buffer
			require.NoError(t, gguf.Write(&buf, nil, append(ts, c.ts...)))
			bf, err := gguf.Parse(buf.Bytes())
			require.NoError(t, err)
			_, _, _, err = FromFile(bf, name)
			assert.ErrorIs(t, err, core.ErrInvalidArgument)
		})
	}
}

func TestModelKeyChangesWithWeights(t *testing.T) {
	a, b := model(t, core.F32, 3), model(t, core.F32, 4)
	assert.Equal(t, ModelKey(a), ModelKey(model(t, core.F32, 3)))
	assert.NotEqual(t, ModelKey(a), ModelKey(b))
	assert.Len(t, ModelKey(a), 32)
}

func TestAnalyze(t *testing.T) {
	// 64 tokens × 16 channels: channel 3 carries outliers 80× the rest, channel 7 one
	// moderate spike beyond the bulk's percentile
	const T, K = 64, 16
	xs := make([]float32, T*K)
	for tk := range T {
		for c := range K {
			xs[tk*K+c] = float32((tk*7+c*13)%21-10) / 10
		}
		xs[tk*K+3] = 80 * float32(tk%5+1) / 5
	}
	xs[10*K+7] = 3
	r := DefaultRule
	r.Percentile = 99
	in, err := r.Analyze("x", xs, K)
	require.NoError(t, err)
	assert.Equal(t, []int32{3}, in.OutlierChannels)
	assert.InDelta(t, 1.0/127, in.Scale, 1e-7) // the bulk's 99th percentile is 1
	assert.InDelta(t, 1.0, in.Threshold, 1e-6)
	assert.Equal(t, float32(80), in.AbsMax)
	assert.Equal(t, T+1, in.Outliers) // every value of channel 3, and the spike
	// the outlier channel is hot; HotFraction 3% of 16 channels (rounded up: 1) admits no other
	assert.Equal(t, []int32{3}, in.Hot)
	assert.Equal(t, T, in.HotOutliers)

	again, err := r.Analyze("x", xs, K)
	require.NoError(t, err)
	assert.Equal(t, in, again, "deterministic")

	_, err = r.Analyze("x", xs[:5], K)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
}

func TestPrune(t *testing.T) {
	layers := []Layer{{Importance: 0.1}, {Importance: 0.5}, {Importance: 0.01}, {Importance: 0.3}, {Importance: 0.2},
		{Importance: 0.05}, {Importance: 0}, {Importance: 0.02}}
	for _, c := range []struct {
		keep float64
		want []bool
	}{
		{0.15, []bool{false, true, false, true, false, false, false, false}}, // ceil(1.2) = 2
		{0, []bool{false, true, false, false, false, false, false, false}},   // at least one
		{1, []bool{true, true, true, true, true, true, true, true}},
	} {
		r := DefaultRule
		r.Keep = c.keep
		r.Prune(layers)
		var got []bool
		for _, l := range layers {
			got = append(got, l.Shadow)
		}
		assert.Equal(t, c.want, got, "keep %g", c.keep)
	}
}

func TestCalibrationValidateAndStore(t *testing.T) {
	good := func() *Calibration {
		c := &Calibration{Version: CalibrationVersion, Model: "k", Arch: "qwen2", Dim: 16, FFN: 32, Layers: make([]Layer, 2)}
		for l := range c.Layers {
			for _, n := range Inputs {
				c.Layers[l].Inputs = append(c.Layers[l].Inputs, Input{Name: n, Scale: 0.1, Threshold: 12.7, Hot: []int32{1}})
			}
		}
		return c
	}
	require.NoError(t, good().Validate("k", "qwen2", 16, 32, 2))
	for _, c := range []struct {
		name string
		edit func(*Calibration)
		key  string
		want error
	}{
		{"other model", func(*Calibration) {}, "other", ErrStale},
		{"other shape", func(c *Calibration) { c.Dim = 8 }, "k", ErrStale},
		{"layers", func(c *Calibration) { c.Layers = c.Layers[:1] }, "k", ErrStale},
		{"version", func(c *Calibration) { c.Version = 9 }, "k", ErrBadCalibration},
		{"scale", func(c *Calibration) { c.Layers[1].Inputs[2].Scale = 0 }, "k", ErrBadCalibration},
		{"hot channel", func(c *Calibration) { c.Layers[0].Inputs[3].Hot = []int32{32} }, "k", ErrBadCalibration},
		{"input order", func(c *Calibration) { c.Layers[0].Inputs[0].Name = InputFFN }, "k", ErrBadCalibration},
	} {
		t.Run(c.name, func(t *testing.T) {
			cal := good()
			c.edit(cal)
			assert.ErrorIs(t, cal.Validate(c.key, "qwen2", 16, 32, 2), c.want)
		})
	}
	path := filepath.Join(t.TempDir(), "sub", "c.json")
	require.NoError(t, good().Save(path))
	back, err := Load(path)
	require.NoError(t, err)
	assert.Equal(t, good(), back)
	_, err = Parse([]byte("{"))
	assert.ErrorIs(t, err, ErrBadCalibration)
}
