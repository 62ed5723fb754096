package w8a8

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/internal/llmtest"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/quant"
	"github.com/xpuhub/xpu/llm/synth"
	"github.com/xpuhub/xpu/sched"
)

// outlierModel is a small synthetic Qwen2 with planted activation outliers (F32 matrices).
func outlierModel(t testing.TB, outliers int, seed uint64) *llm.Model {
	t.Helper()
	s, err := synth.Preset("qwen2", "260K", core.F32, seed)
	require.NoError(t, err)
	s.Outliers = outliers
	f, err := synth.Parse(s)
	require.NoError(t, err)
	m, err := llm.FromFile(f)
	require.NoError(t, err)
	return m
}

// The planted channels are what calibration finds: outlier channels of the normed inputs,
// hot for the shadow path, and the scale covers the bulk only.
func TestCalibrateFindsPlantedOutliers(t *testing.T) {
	ctx := context.Background()
	m := outlierModel(t, 3, 5)
	s, _ := synth.Preset("qwen2", "260K", core.F32, 5)
	s.Outliers = 3
	planted := s.OutlierChannels()
	cal, err := Calibrate(ctx, m, llmtest.RefDevice(t), DefaultCalibrationText, WithImportance(false), WithTokens(64))
	require.NoError(t, err)
	require.NoError(t, cal.Validate(ModelKey(m.File), "qwen2", 64, 192, 5))
	assert.Equal(t, 64, cal.Tokens)
	for l, ly := range cal.Layers {
		for _, in := range ly.Inputs {
			if in.Name != InputAttn && in.Name != InputFFN {
				continue
			}
			var want []int32
			for _, c := range planted {
				want = append(want, int32(c))
			}
			assert.Equal(t, want, in.OutlierChannels, "layer %d %s", l, in.Name)
			assert.Subset(t, want, in.Hot, "layer %d %s", l, in.Name)
			assert.Greater(t, in.AbsMax/in.Threshold, float32(20), "layer %d %s: outliers far beyond the threshold", l, in.Name)
		}
		assert.NotEmpty(t, ly.OutAbsMax["attn_q"])
	}
	// deterministic: the same model, text and rule give the same record
	again, err := Calibrate(ctx, m, llmtest.RefDevice(t), DefaultCalibrationText, WithImportance(false), WithTokens(64))
	require.NoError(t, err)
	assert.Equal(t, cal, again)

	_, err = Calibrate(ctx, m, llmtest.RefDevice(t), "hi", WithImportance(false))
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
}

func TestW8A8Errors(t *testing.T) {
	ctx := context.Background()
	m := outlierModel(t, 2, 5)
	other := outlierModel(t, 2, 6)
	cal, err := Calibrate(ctx, m, llmtest.RefDevice(t), DefaultCalibrationText, WithImportance(false), WithTokens(32))
	require.NoError(t, err)
	for _, c := range []struct {
		name string
		m    *llm.Model
		cfg  Config
		want error
	}{
		{"no calibration", m, Config{Convert: true}, core.ErrInvalidArgument},
		{"another model's calibration", other, Config{Calibration: cal, Convert: true}, ErrStale},
		{"no int8 weights", m, Config{Calibration: cal}, ErrNoInt8},
		{"shadow flags", m, Config{Calibration: cal, Convert: true, ShadowLayers: []bool{true}}, core.ErrInvalidArgument},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewLowering(c.m, c.cfg)
			assert.ErrorIs(t, err, c.want)
		})
	}
	// the int8 weights of a file written by quantize --npu-int8 are used as they are
	var buf bytes.Buffer
	_, err = WriteModel(ctx, &buf, m.File, PerChannel)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "npu.gguf")
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
	nm, err := llm.Open(path)
	require.NoError(t, err)
	defer nm.Close()
	w, err := NewLowering(nm, Config{Calibration: cal, Shadow: ShadowOn})
	require.NoError(t, err, "the calibration of the original fits its npu-int8 copy")
	assert.Equal(t, PerChannel, w.Granularity())
	assert.Contains(t, w.Describe(), "from the file")
}

// One W8A8 projection as the graph lowers it (QUANTIZE, int8 MATMUL, SHADOW_MATMUL over the hot
// channels, ADD), run on the reference, equals the composition computed here from its
// definition: sa·sw·Σ q(x)·q(w) on the 16-bit output grid, plus Σ over hot channels of
// (x − clamp(x, ±127·sa))·w.
func TestShadowPathEqualsComposition(t *testing.T) {
	ctx := context.Background()
	m := outlierModel(t, 3, 5)
	cal, err := Calibrate(ctx, m, llmtest.RefDevice(t), DefaultCalibrationText, WithImportance(false), WithTokens(32))
	require.NoError(t, err)
	const l, proj = 1, "ffn_gate"
	name := "blk.1.ffn_gate.weight"
	for _, c := range []struct {
		name   string
		shadow ShadowMode
		gran   Granularity
	}{
		{"per-tensor, shadow", ShadowOn, PerTensor},
		{"per-channel, shadow", ShadowOn, PerChannel},
		{"per-tensor, no shadow", ShadowOff, PerTensor},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, err := NewLowering(m, Config{Calibration: cal, Shadow: c.shadow, Convert: true, Granularity: c.gran})
			require.NoError(t, err)
			in := w.input(l, proj)
			K, N := int64(m.Config.Dim), int64(m.Config.FFN)
			const M = 6
			xs := make([]float32, M*K)
			for i := range xs {
				xs[i] = float32((i*37)%23-11) * in.Scale * 9 // the bulk, some of it beyond the threshold
			}
			for r := range M {
				for _, h := range in.Hot {
					xs[int64(r)*K+int64(h)] = float32(60*(r+1)) * in.Threshold / 10 // far beyond
				}
			}
			g := core.NewGraph()
			x := g.Input("x", core.F32, M, K)
			g.Output(w.BeginStage().Linear(g, x, l, proj))
			require.NoError(t, g.Err())
			out, err := refRun(ctx, g, core.EncodeF32(xs))
			require.NoError(t, err)
			got := core.DecodeF32(out)

			iw := w.mats[name]
			mw, _ := m.Weight(name)
			wf, err := core.Dequantize(mw.DType, mw.Data, 0)
			require.NoError(t, err)
			tt := float64(in.Threshold)
			var num, den float64
			for r := range M {
				for n := range N {
					sw := float64(iw.Scales[0])
					if len(iw.Scales) > 1 {
						sw = float64(iw.Scales[n])
					}
					var acc, shadow float64
					for k := range K {
						xv := float64(xs[int64(r)*K+k])
						q := math.Round(xv / float64(in.Scale))
						q = math.Max(-127, math.Min(127, q))
						acc += q * float64(int8(iw.Codes[n*K+k]))
					}
					if c.shadow == ShadowOn {
						for _, h := range in.Hot {
							xv := float64(xs[int64(r)*K+int64(h)])
							shadow += (xv - math.Max(-tt, math.Min(tt, xv))) * float64(wf[n*K+int64(h)])
						}
					}
					want := acc * float64(in.Scale) * sw
					if so := float64(outHeadroom * w.cal.Layers[l].OutAbsMax[proj] / 32767); so > 0 {
						// the 16-bit output grid (OPS.md: MATMUL's output requantization)
						want = so * math.Max(-32767, math.Min(32767, math.Round(want/so)))
					}
					want += shadow
					d := float64(got[int64(r)*N+n]) - want
					num += d * d
					den += want * want
				}
			}
			assert.Less(t, num/den, 1e-9, "relative squared error")
		})
	}
}

// npuTakesW8A8 says whether the qnn device (devs[0]) accepts a W8A8 MATMUL of an I8
// activation by an I8 weight, with the 16-bit output grid the lowering sets.
func npuTakesW8A8(t *testing.T, devs []core.Device) bool {
	ctx := context.Background()
	g := core.NewGraph()
	x := g.Input("x", core.F32, 4, 64)
	q := g.Quantize(x, core.I8, 0.01)
	w := g.Const("w", core.I8, core.Shape{64, 64}, make([]byte, 64*64))
	g.Output(g.MatMulW8A8(q, w, core.W8A8Options{AScale: 0.01, BScale: 0.02, OutScale: 1e-4, Out: core.F32}))
	require.NoError(t, g.Err())
	c, err := devs[0].NewContext(ctx, nil)
	require.NoError(t, err)
	defer c.Close()
	v, err := c.Analyze(ctx, g)
	require.NoError(t, err)
	return v[len(v)-1].Supported
}

// teacherForced runs ids through m on dev in one chunk: every position's logits.
func teacherForced(ctx context.Context, m *llm.Model, dev core.Device, ids []int32, opts ...llm.RunnerOption) ([]float32, error) {
	n := len(ids)
	r, err := llm.NewRunner(ctx, m, dev, append([]llm.RunnerOption{llm.WithChunkSize(n), llm.WithContextLength(n)}, opts...)...)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.TeacherForced(ctx, ids)
}

// refRun runs g on the reference with the given inputs and returns its first output.
func refRun(ctx context.Context, g *core.Graph, inputs ...[]byte) ([]byte, error) {
	outs, err := ref.Run(ctx, g, inputs)
	if err != nil {
		return nil, err
	}
	return outs[0], nil
}

// On a model with planted outliers, per-tensor W8A8 without the shadow path is far worse than
// with it (the outlier channels are clipped to the threshold), and pruning sits between.
func TestW8A8NMSEOrdering(t *testing.T) {
	ctx := context.Background()
	m := outlierModel(t, 3, 5)
	dev := llmtest.RefDevice(t)
	cal, err := Calibrate(ctx, m, dev, DefaultCalibrationText, WithTokens(32))
	require.NoError(t, err)
	kept := 0
	for _, ly := range cal.Layers {
		if ly.Shadow {
			kept++
		}
		assert.Positive(t, ly.Importance, "every layer has planted outliers")
	}
	assert.Equal(t, 1, kept, "15% of 5 layers, rounded up")
	ids := m.Tokenizer.Encode("The little robot woke up early and looked out of the window at the rain.", true)
	want, err := teacherForced(ctx, m, dev, ids)
	require.NoError(t, err)
	nmse := map[ShadowMode]float64{}
	for _, mode := range []ShadowMode{ShadowOff, ShadowOn, ShadowPruned} {
		w, err := NewLowering(m, Config{Calibration: cal, Shadow: mode, Convert: true})
		require.NoError(t, err)
		got, err := teacherForced(ctx, m, dev, ids, WithLowering(w))
		require.NoError(t, err)
		nmse[mode] = quant.NMSE(got, want)
	}
	t.Logf("logits NMSE against F32: shadow off %.3g, on %.3g, pruned %.3g", nmse[ShadowOff], nmse[ShadowOn], nmse[ShadowPruned])
	assert.Greater(t, nmse[ShadowOff], 10*nmse[ShadowOn])
	assert.Less(t, nmse[ShadowPruned], nmse[ShadowOff])
	assert.Greater(t, nmse[ShadowPruned], nmse[ShadowOn])
	assert.Less(t, nmse[ShadowOn], 0.05)
}

// stories260K greedy from BOS with W8A8 + shadow is the F32 model's greedy text for at least
// 64 tokens: on the reference, and with the int8 work on the emulated NPU and the rest (the
// shadow path included) on neon, through the scheduler.
func TestW8A8GreedyStories(t *testing.T) {
	ctx := context.Background()
	m := llmtest.Stories(t)
	// layers ranked by max|outlier|/scale (measuring importance is TestW8A8NMSEOrdering's)
	cal, err := Calibrate(ctx, m, llmtest.RefDevice(t), DefaultCalibrationText, WithImportance(false), WithTokens(96))
	require.NoError(t, err)
	const n = 64
	// an F32 KV cache throughout: the test measures the weights' quantization alone
	f32, err := llm.NewRunner(ctx, m, llmtest.RefDevice(t), llm.WithContextLength(n+1), llm.WithKVCacheType(core.F32))
	require.NoError(t, err)
	defer f32.Close()
	want, err := f32.Generate(ctx, "", llm.WithMaxTokens(n))
	require.NoError(t, err)
	require.Len(t, want.Tokens, n)
	devs := func(t *testing.T) []core.Device { return llmtest.PluginDevices(t, "qnn", "neon") }
	for _, units := range []string{"ref", "qnn+neon"} {
		for _, mode := range []ShadowMode{ShadowPruned, ShadowOn} {
			t.Run(units+"/"+mode.String(), func(t *testing.T) {
				w, err := NewLowering(m, Config{Calibration: cal, Shadow: mode, Convert: true})
				require.NoError(t, err)
				var r *llm.Runner
				if units == "ref" {
					r, err = llm.NewRunner(ctx, m, llmtest.RefDevice(t), llm.WithContextLength(n+1), WithLowering(w), llm.WithKVCacheType(core.F32))
				} else {
					devs := devs(t)
					specs := []sched.UnitSpec{{Backend: "qnn"}, {Backend: "neon"}}
					plan, perr := llm.DefaultPlan(m, devs, specs)
					require.NoError(t, perr)
					r, err = llm.NewPlannedRunner(ctx, m, devs, Plan(plan), llm.WithContextLength(n+1), WithLowering(w), llm.WithKVCacheType(core.F32))
				}
				require.NoError(t, err)
				defer r.Close()
				if units != "ref" {
					// the CPU unit quantizes the activations and runs the shadow products and the
					// output head; the int8 products run on the NPU where it takes them (else they
					// fall back to the CPU unit, by the plan's fallback)
					pl := r.Placement()
					assert.Regexp(t, `neon:0 .*QUANTIZE×20.*SHADOW_MATMUL×\d+`, pl)
					if npuTakesW8A8(t, devs(t)) {
						assert.Regexp(t, `qnn:0 +MATMUL×35\n`, pl) // the 35 projections, nothing else
					} else {
						t.Log("the qnn plugin refuses the int8 MATMUL: it runs on neon")
						assert.NotContains(t, pl, "qnn:0")
					}
				}
				got, err := r.Generate(ctx, "", llm.WithMaxTokens(n))
				require.NoError(t, err)
				same := 0
				for same < n && same < len(got.Tokens) && got.Tokens[same] == want.Tokens[same] {
					same++
				}
				t.Logf("W8A8, shadow %s, on %s: %d of %d greedy tokens match F32", mode, units, same, n)
				assert.Equal(t, n, same, "got %q\nwant %q", got.Text, want.Text)
			})
		}
	}
}

// WithLowering(nil) leaves the projections as the model has them; a lowering changes them.
func TestWithLoweringNil(t *testing.T) {
	ctx := context.Background()
	m := outlierModel(t, 2, 5)
	dev := llmtest.RefDevice(t)
	ids := []int32{1, 5, 9, 3}
	plain, err := teacherForced(ctx, m, dev, ids)
	require.NoError(t, err)
	got, err := teacherForced(ctx, m, dev, ids, WithLowering(nil))
	require.NoError(t, err)
	assert.Equal(t, plain, got)
	cal, err := Calibrate(ctx, m, dev, DefaultCalibrationText, WithImportance(false), WithTokens(32))
	require.NoError(t, err)
	w, err := NewLowering(m, Config{Calibration: cal, Shadow: ShadowOff, Convert: true})
	require.NoError(t, err)
	low, err := teacherForced(ctx, m, dev, ids, WithLowering(w))
	require.NoError(t, err)
	assert.NotEqual(t, plain, low)
}
