package w8a8

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/quant"
)

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
	rule       Rule
	maxTokens  int
	importance bool
	gran       Granularity
}

// CalibrateOption configures Calibrate.
type CalibrateOption func(*calibConfig)

// WithRule replaces DefaultRule.
func WithRule(r Rule) CalibrateOption { return func(c *calibConfig) { c.rule = r } }

// WithTokens caps the calibration text at n tokens (default 256).
func WithTokens(n int) CalibrateOption { return func(c *calibConfig) { c.maxTokens = n } }

// WithImportance turns the measurement of each layer's shadow importance on (the default) or
// off (then the layers are ranked by mllm-NPU's max|outlier|/scale ratio). Measuring runs the
// W8A8 model once per layer with outliers, plus once.
func WithImportance(on bool) CalibrateOption { return func(c *calibConfig) { c.importance = on } }

// WithGranularity is the weight granularity the importance runs convert to when the
// file has no NPU int8 weights (default per tensor).
func WithGranularity(g Granularity) CalibrateOption {
	return func(c *calibConfig) { c.gran = g }
}

// Calibrate runs m on dev (the reference backend is fine for small models) over text,
// teacher-forced in one chunk, and records per MATMUL input its per-tensor activation scale,
// outlier threshold and hot channels, and per layer its shadow importance and whether pruning
// keeps its shadow path, by the rule (Rule documents it). The result is keyed to m
// (ModelKey) and deterministic for a model, text, rule and device.
func Calibrate(ctx context.Context, m *llm.Model, dev core.Device, text string, opts ...CalibrateOption) (*Calibration, error) {
	cfg := calibConfig{rule: DefaultRule, maxTokens: 256, importance: true}
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
		return nil, fmt.Errorf("w8a8: calibration text of %d tokens: at least 8 are needed: %w", len(ids), core.ErrInvalidArgument)
	}
	n := len(ids)
	acts := make([][][]float32, c.Layers) // [layer][input]
	outs := make([]map[string]float32, c.Layers)
	for l := range acts {
		acts[l] = make([][]float32, len(Inputs))
		outs[l] = map[string]float32{}
	}
	rec := &recorder{m: m, layers: c.Layers, acts: acts, outs: outs}
	// an F32 cache: the ranges are the full-precision model's, whatever cache it runs with later
	r, err := llm.NewRunner(ctx, m, dev, llm.WithChunkSize(n), llm.WithContextLength(n), llm.WithKVCacheType(core.F32),
		llm.WithProjectionHook(rec))
	if err != nil {
		return nil, fmt.Errorf("w8a8: calibration run: %w", err)
	}
	_, err = r.Prefill(ctx, ids)
	if cerr := r.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("w8a8: calibration run: %w", err)
	}
	cal := &Calibration{Version: CalibrationVersion, Model: ModelKey(m.File), Arch: c.Arch,
		Dim: c.Dim, FFN: c.FFN, Heads: c.Heads, Tokens: n, Rule: cfg.rule, Layers: make([]Layer, c.Layers)}
	for l := range c.Layers {
		ly := &cal.Layers[l]
		ly.OutAbsMax = outs[l]
		for i, name := range Inputs {
			in, err := cfg.rule.Analyze(name, acts[l][i], Width(name, c.Dim, c.FFN))
			if err != nil {
				return nil, fmt.Errorf("w8a8: calibration of layer %d: %w", l, err)
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

// recorder is the calibration run's projection hook: the model's own projections, each one's
// input and output read back after the run, the inputs' activations kept per layer and the
// outputs' largest magnitude.
type recorder struct {
	m      *llm.Model
	layers int
	acts   [][][]float32        // [layer][input]: the activations of input Inputs[i]
	outs   []map[string]float32 // [layer][projection]: max |output|
}

// tap says what a tensor read back holds: the input of projection proj of layer, or with out
// set its output.
type tap struct {
	layer int
	proj  string
	out   bool
}

// BeginStage implements llm.ProjectionHook.
func (rec *recorder) BeginStage() llm.ProjectionBuilder {
	return &recordStage{rec: rec, seen: map[*core.Tensor]bool{}}
}

// recordStage builds one stage graph's projections as the model has them and lists their
// inputs and outputs to read back.
type recordStage struct {
	rec     *recorder
	tensors []*core.Tensor
	what    []tap
	seen    map[*core.Tensor]bool
}

var _ llm.ProjectionReader = (*recordStage)(nil)

// Linear implements llm.ProjectionBuilder: the model's MATMUL, its input and output read back.
// Projections that share an input read it once, under the first of them the graph applies.
func (st *recordStage) Linear(g *core.Graph, x *core.Tensor, l int, p string) *core.Tensor {
	y := st.rec.m.Block(g).Linear(x, l, p)
	st.add(x, tap{layer: l, proj: p})
	st.add(y, tap{layer: l, proj: p, out: true})
	return y
}

func (st *recordStage) add(x *core.Tensor, w tap) {
	if x == nil || st.seen[x] {
		return
	}
	st.seen[x] = true
	st.tensors = append(st.tensors, x)
	st.what = append(st.what, w)
}

// ReadBack implements llm.ProjectionReader.
func (st *recordStage) ReadBack() []*core.Tensor { return st.tensors }

// Read implements llm.ProjectionReader: it records tensor i's activations (an input) or its
// largest magnitude (an output).
func (st *recordStage) Read(i int, data []byte) error {
	rec := st.rec
	if i < 0 || i >= len(st.what) || st.what[i].layer < 0 || st.what[i].layer >= rec.layers {
		return fmt.Errorf("w8a8: calibration read-back %d of %d: %w", i, len(st.what), core.ErrInternal)
	}
	t := st.what[i]
	xs := core.DecodeF32(data)
	if t.out {
		for _, x := range xs {
			rec.outs[t.layer][t.proj] = max(rec.outs[t.layer][t.proj], float32(math.Abs(float64(x))))
		}
		return nil
	}
	in := slices.Index(Inputs, InputOf(t.proj))
	if in < 0 {
		return fmt.Errorf("w8a8: calibration read-back %+v: %w", t, core.ErrInternal)
	}
	rec.acts[t.layer][in] = append(rec.acts[t.layer][in], xs...)
	return nil
}

// measureImportance sets each layer's Importance: the logits NMSE between the W8A8 model with
// every shadow path and the same without that layer's (0 for a layer with no hot channel).
func measureImportance(ctx context.Context, m *llm.Model, dev core.Device, cal *Calibration, ids []int32, g Granularity) error {
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
		cal.Layers[l].Importance = quant.NMSE(got, base)
	}
	return nil
}

// w8a8Logits runs m lowered to Lowering with the given shadow layers over ids, teacher-forced, and
// returns every position's logits (flattened).
func w8a8Logits(ctx context.Context, m *llm.Model, dev core.Device, cal *Calibration, ids []int32, shadow []bool, g Granularity) ([]float32, error) {
	w, err := NewLowering(m, Config{Calibration: cal, ShadowLayers: shadow, Convert: true, Granularity: g})
	if err != nil {
		return nil, err
	}
	n := len(ids)
	r, err := llm.NewRunner(ctx, m, dev, llm.WithChunkSize(n), llm.WithContextLength(n), WithLowering(w), llm.WithKVCacheType(core.F32))
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.TeacherForced(ctx, ids)
}
