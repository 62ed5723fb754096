package llm

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/w8a8"
)

// WithW8A8 runs the seven projections of every layer as w's W8A8 lowering (NewW8A8): an int8
// MATMUL, which a plan places on an NPU unit, and QUANTIZE and the shadow path
// (SHADOW_MATMUL + ADD), which it places on a CPU unit (w8a8.Plan).
func WithW8A8(w *W8A8) RunnerOption {
	if w == nil {
		return WithProjectionHook(nil)
	}
	return WithProjectionHook(w)
}

// DefaultCalibrationText is the built-in calibration text: varied English prose (narrative,
// dialogue, numbers, lists), the kind of text the activations' bulk and outliers show up on.
const DefaultCalibrationText = `Once upon a time, in a small town by the sea, there lived a girl named Lily. She loved to ` +
	`walk on the beach every morning and collect shells. One day she found a big blue shell with a ` +
	`tiny crab inside. "Hello, little crab," she said. "Do you want to be my friend?" The crab ` +
	`waved its claw, and Lily laughed. She carried it home in a bucket of water and showed it to her ` +
	`mother, who smiled and said they must bring it back before dinner.
The meeting starts at 9:30 on Monday, 14 March. Please bring the report, the three charts and ` +
	`the list of 25 open questions. The budget grew from 1.2 million to 1.5 million dollars, an ` +
	`increase of 25 percent, mostly because of travel and new equipment.
To bake the bread, mix 500 g of flour, 10 g of salt, 7 g of yeast and 320 ml of warm water. ` +
	`Knead the dough for ten minutes, let it rise for an hour, shape it and bake it at 220 degrees ` +
	`for thirty minutes until the crust is golden brown.
Tom and his dog Max went to the park. Max ran after a red ball and jumped into the pond. Tom ` +
	`was not angry; he laughed, dried the happy dog with his coat, and they walked home together ` +
	`as the sun went down behind the hills.`

type calibConfig struct {
	rule       w8a8.Rule
	maxTokens  int
	importance bool
	gran       w8a8.Granularity
}

// CalibrateOption configures Calibrate.
type CalibrateOption func(*calibConfig)

// WithCalibrationRule replaces w8a8.DefaultRule.
func WithCalibrationRule(r w8a8.Rule) CalibrateOption { return func(c *calibConfig) { c.rule = r } }

// WithCalibrationTokens caps the calibration text at n tokens (default 256).
func WithCalibrationTokens(n int) CalibrateOption { return func(c *calibConfig) { c.maxTokens = n } }

// WithImportance turns the measurement of each layer's shadow importance on (the default) or
// off (then the layers are ranked by mllm-NPU's max|outlier|/scale ratio). Measuring runs the
// W8A8 model once per layer with outliers, plus once.
func WithImportance(on bool) CalibrateOption { return func(c *calibConfig) { c.importance = on } }

// WithCalibrationGranularity is the weight granularity the importance runs convert to when the
// file has no NPU int8 weights (default per tensor).
func WithCalibrationGranularity(g w8a8.Granularity) CalibrateOption {
	return func(c *calibConfig) { c.gran = g }
}

// Calibrate runs m on dev (the reference backend is fine for small models) over text,
// teacher-forced in one chunk, and records per MATMUL input its per-tensor activation scale,
// outlier threshold and hot channels, and per layer its shadow importance and whether pruning
// keeps its shadow path, by the rule (w8a8.Rule documents it). The result is keyed to m
// (w8a8.ModelKey) and deterministic for a model, text, rule and device.
func Calibrate(ctx context.Context, m *Model, dev core.Device, text string, opts ...CalibrateOption) (*w8a8.Calibration, error) {
	cfg := calibConfig{rule: w8a8.DefaultRule, maxTokens: 256, importance: true}
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.rule.Check(); err != nil {
		return nil, err
	}
	c := m.Config
	ids := m.Tokenizer.Encode(text, true)
	if cfg.maxTokens > 0 && len(ids) > cfg.maxTokens {
		ids = ids[:cfg.maxTokens]
	}
	if len(ids) < 8 {
		return nil, fmt.Errorf("llm: calibration text of %d tokens: at least 8 are needed: %w", len(ids), core.ErrInvalidArgument)
	}
	n := len(ids)
	acts := make([][][]float32, c.Layers) // [layer][input]
	outs := make([]map[string]float32, c.Layers)
	for l := range acts {
		acts[l] = make([][]float32, len(w8a8.Inputs))
		outs[l] = map[string]float32{}
	}
	var tapErr error
	tap := func(w tapWhat, data []byte) {
		xs := core.DecodeF32(data)
		if w.out {
			for _, x := range xs {
				outs[w.layer][w.name] = max(outs[w.layer][w.name], float32(math.Abs(float64(x))))
			}
			return
		}
		i := slices.Index(w8a8.Inputs, w.name)
		if i < 0 || w.layer >= c.Layers {
			tapErr = fmt.Errorf("llm: calibration tap %+v: %w", w, core.ErrInternal)
			return
		}
		acts[w.layer][i] = append(acts[w.layer][i], xs...)
	}
	// an F32 cache: the ranges are the full-precision model's, whatever cache it runs with later
	r, err := NewRunner(ctx, m, dev, WithChunkSize(n), WithContextLength(n), WithKVCacheType(core.F32),
		func(rc *runnerConfig) { rc.tap = tap })
	if err != nil {
		return nil, fmt.Errorf("llm: calibration run: %w", err)
	}
	_, err = r.Prefill(ctx, ids)
	if cerr := r.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = tapErr
	}
	if err != nil {
		return nil, fmt.Errorf("llm: calibration run: %w", err)
	}
	cal := &w8a8.Calibration{Version: w8a8.CalibrationVersion, Model: w8a8.ModelKey(m.File), Arch: c.Arch,
		Dim: c.Dim, FFN: c.FFN, Heads: c.Heads, Tokens: n, Rule: cfg.rule, Layers: make([]w8a8.Layer, c.Layers)}
	for l := range c.Layers {
		ly := &cal.Layers[l]
		ly.OutAbsMax = outs[l]
		for i, name := range w8a8.Inputs {
			in, err := cfg.rule.Analyze(name, acts[l][i], w8a8.Width(name, c.Dim, c.FFN))
			if err != nil {
				return nil, fmt.Errorf("llm: calibration of layer %d: %w", l, err)
			}
			ly.Inputs = append(ly.Inputs, in)
			ly.Ratio = max(ly.Ratio, float64(in.AbsMax/in.Scale))
		}
	}
	if cfg.importance {
		if err := measureImportance(ctx, m, dev, cal, ids, cfg.gran); err != nil {
			return nil, err
		}
	}
	cfg.rule.Prune(cal.Layers)
	return cal, nil
}

// measureImportance sets each layer's Importance: the logits NMSE between the W8A8 model with
// every shadow path and the same without that layer's (0 for a layer with no hot channel).
func measureImportance(ctx context.Context, m *Model, dev core.Device, cal *w8a8.Calibration, ids []int32, g w8a8.Granularity) error {
	L := m.Config.Layers
	all := make([]bool, L)
	var layers []int
	for l, ly := range cal.Layers {
		all[l] = true
		for _, in := range ly.Inputs {
			if len(in.Hot) > 0 {
				layers = append(layers, l)
				break
			}
		}
	}
	if len(layers) == 0 {
		return nil
	}
	base, err := w8a8Logits(ctx, m, dev, cal, ids, all, g)
	if err != nil {
		return err
	}
	for _, l := range layers {
		without := slices.Clone(all)
		without[l] = false
		got, err := w8a8Logits(ctx, m, dev, cal, ids, without, g)
		if err != nil {
			return err
		}
		cal.Layers[l].Importance = NMSE(got, base)
	}
	return nil
}

// w8a8Logits runs m lowered to W8A8 with the given shadow layers over ids, teacher-forced, and
// returns every position's logits (flattened).
func w8a8Logits(ctx context.Context, m *Model, dev core.Device, cal *w8a8.Calibration, ids []int32, shadow []bool, g w8a8.Granularity) ([]float32, error) {
	w, err := NewW8A8(m, w8a8.Config{Calibration: cal, ShadowLayers: shadow, Convert: true, Granularity: g})
	if err != nil {
		return nil, err
	}
	n := len(ids)
	r, err := NewRunner(ctx, m, dev, WithChunkSize(n), WithContextLength(n), WithW8A8(w), WithKVCacheType(core.F32))
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.TeacherForced(ctx, ids)
}

// TeacherForced feeds ids after what the cache holds and returns the logits after every one of
// them, flattened ([len(ids)·vocab]): what a logits NMSE compares. A runner whose chunk length
// is len(ids) runs them in one pass.
func (r *Runner) TeacherForced(ctx context.Context, ids []int32) ([]float32, error) {
	out := make([]float32, 0, len(ids)*r.m.Config.Vocab)
	_, err := r.PrefillEach(ctx, ids, func(_ int, logits []float32) error {
		out = append(out, logits...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// NMSE is Σ(got−want)² / Σwant² (0 when both are all zero, +Inf when only want is).
func NMSE(got, want []float32) float64 {
	var num, den float64
	for i := range want {
		d := float64(got[i]) - float64(want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	if den == 0 {
		if num == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return num / den
}
