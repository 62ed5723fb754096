package llm

import (
	"fmt"
	"slices"
	"strings"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/w8a8"
)

// W8A8 is a model lowered for an int8 NPU: per W8A8 MATMUL, QUANTIZE(x → I8, sa) (one per
// distinct input) and an int8 × int8 MATMUL (the NPU's part), and in the layers with a shadow
// path SHADOW_MATMUL(x, the hot channels' float weight columns, their ids, 127·sa) added to it
// (the CPU's part). The embedding and the output head stay as they are. Use it with WithW8A8.
type W8A8 struct {
	cal    *w8a8.Calibration
	gran   w8a8.Granularity
	shadow []bool
	mats   map[string]w8Mat
	cols   map[string]shadowCols
	// fromFile: the int8 weights came from the file's layout (else converted at load time).
	fromFile bool
}

// shadowCols are a matrix's float weight columns for its input's hot channels.
type shadowCols struct {
	wt  []byte // F32 [C, N]: row c is column ids[c] of the [N, K] weight
	ids []byte // I32 [C]
	c   int64
}

// NewW8A8 checks cfg's calibration against m (its key and shape: a stale one is an error
// wrapping w8a8.ErrStale), reads or converts the int8 weights and gathers the hot weight
// columns.
func NewW8A8(m *Model, cfg w8a8.Config) (*W8A8, error) {
	c := m.Config
	if cfg.Calibration == nil {
		return nil, fmt.Errorf("llm: W8A8 needs a calibration (xpu calibrate): %w", core.ErrInvalidArgument)
	}
	if err := cfg.Calibration.Validate(w8a8.ModelKey(m.File), c.Arch, c.Dim, c.FFN, c.Layers); err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}
	if _, err := w8a8.HasLayout(m.File); err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}
	w := &W8A8{cal: cfg.Calibration, gran: cfg.Granularity, mats: map[string]w8Mat{}, cols: map[string]shadowCols{},
		shadow: make([]bool, c.Layers)}
	switch {
	case cfg.ShadowLayers != nil:
		if len(cfg.ShadowLayers) != c.Layers {
			return nil, fmt.Errorf("llm: %d shadow layer flags for %d layers: %w", len(cfg.ShadowLayers), c.Layers, core.ErrInvalidArgument)
		}
		copy(w.shadow, cfg.ShadowLayers)
	case cfg.Shadow == w8a8.ShadowOn:
		for l := range w.shadow {
			w.shadow[l] = true
		}
	case cfg.Shadow == w8a8.ShadowPruned:
		for l, ly := range cfg.Calibration.Layers {
			w.shadow[l] = ly.Shadow
		}
	case cfg.Shadow != w8a8.ShadowOff:
		return nil, fmt.Errorf("llm: shadow mode %v: %w", cfg.Shadow, core.ErrInvalidArgument)
	}
	for l := range c.Layers {
		for _, p := range w8a8.Projections {
			name := fmt.Sprintf("blk.%d.%s.weight", l, p)
			ww := m.weights[name]
			n, k := int(ww.shape[0]), int(ww.shape[1])
			q, g, ok, err := w8a8.FromFile(m.File, name)
			if err != nil {
				return nil, fmt.Errorf("llm: %w", err)
			}
			var xs []float32
			if !ok {
				if !cfg.Convert {
					return nil, fmt.Errorf("llm: %s: %w", name, w8a8.ErrNoInt8)
				}
				if xs, err = core.Dequantize(ww.dtype, ww.data, 0); err != nil {
					return nil, fmt.Errorf("llm: %s: %w", name, err)
				}
				if q, err = w8a8.QuantizeWeight(xs, n, k, cfg.Granularity); err != nil {
					return nil, fmt.Errorf("llm: %s: %w", name, err)
				}
				g = cfg.Granularity
			} else {
				w.fromFile = true
			}
			w.gran = g
			w.mats[name] = w8Mat{Weight: q, shape: ww.shape}
			hot := w.input(l, p).Hot
			if !w.shadow[l] || len(hot) == 0 {
				continue
			}
			if xs == nil {
				if xs, err = core.Dequantize(ww.dtype, ww.data, 0); err != nil {
					return nil, fmt.Errorf("llm: %s: %w", name, err)
				}
			}
			wt := make([]float32, len(hot)*n)
			for ci, ch := range hot {
				for r := range n {
					wt[ci*n+r] = xs[r*k+int(ch)]
				}
			}
			w.cols[name] = shadowCols{wt: core.EncodeF32(wt), ids: core.EncodeI32(hot), c: int64(len(hot))}
		}
	}
	return w, nil
}

// input is the calibration record of the input projection p of layer l reads.
func (w *W8A8) input(l int, p string) w8a8.Input {
	in := w8a8.InputOf(p)
	return w.cal.Layers[l].Inputs[slices.Index(w8a8.Inputs, in)]
}

// ShadowLayers says which layers run the shadow path.
func (w *W8A8) ShadowLayers() []bool { return slices.Clone(w.shadow) }

// Granularity is the weights' scale granularity.
func (w *W8A8) Granularity() w8a8.Granularity { return w.gran }

// Calibration is the calibration in use.
func (w *W8A8) Calibration() *w8a8.Calibration { return w.cal }

// ShadowWork is the share of the full shadow work kept: hot channels of layers with a shadow
// path over hot channels of every layer (1 with every layer on, 0 without outliers).
func (w *W8A8) ShadowWork() float64 {
	var kept, all int
	for l, ly := range w.cal.Layers {
		for _, in := range ly.Inputs {
			all += len(in.Hot)
			if w.shadow[l] {
				kept += len(in.Hot)
			}
		}
	}
	if all == 0 {
		return 0
	}
	return float64(kept) / float64(all)
}

// Describe summarizes the lowering for a log line.
func (w *W8A8) Describe() string {
	var on []string
	for l, s := range w.shadow {
		if s {
			on = append(on, fmt.Sprint(l))
		}
	}
	src := "converted at load"
	if w.fromFile {
		src = "from the file"
	}
	layers := "none"
	if len(on) > 0 {
		layers = strings.Join(on, ",")
	}
	return fmt.Sprintf("W8A8 (per-%s int8 weights %s), shadow layers %s (%.0f%% of the shadow work)",
		w.gran, src, layers, 100*w.ShadowWork())
}

// stageBuild is what shapes one stage graph beyond the model: the W8A8 lowering and the
// calibration taps.
type stageBuild struct {
	// lin, from the runner's ProjectionHook, builds the projections its technique rewrites.
	lin ProjectionBuilder
	// taps, when not nil, collects the MATMUL inputs and outputs as extra graph outputs.
	taps *tapSet
	// shard gives the shard of each node of a sharded decode stage that belongs to one (by
	// node ID); the rules place the others.
	shard map[int]int
	// shared are the pieces of a stealing sharded stage (StageSpec.Shared), node IDs.
	shared [][]int
	// batch, above 1, builds a batched decode step of that many sequences (batch.go): each
	// with its own cache inputs, attention and K/V outputs.
	batch int
	// hidden ends the last stage with the final-normed hidden state, not the logits (embed.go).
	hidden bool
}

// sharedPiece records the nodes g added from mark on as a piece either shard unit may run
// (StageSpec.Shared).
func (sb *stageBuild) sharedPiece(g *core.Graph, mark int) {
	var ids []int
	for _, n := range g.Nodes[mark:] {
		ids = append(ids, n.ID)
	}
	sb.shared = append(sb.shared, ids)
}

// own records the nodes g added from mark on as shard s's.
func (sb *stageBuild) own(g *core.Graph, mark, s int) {
	if sb.shard == nil {
		sb.shard = map[int]int{}
	}
	for _, n := range g.Nodes[mark:] {
		sb.shard[n.ID] = s
	}
}

// tapSet lists a stage's tapped tensors and what each is.
type tapSet struct {
	tensors []*core.Tensor
	what    []tapWhat
	seen    map[*core.Tensor]bool
}

// tapWhat says what a tap holds: layer l's input (or a projection's output, out set).
type tapWhat struct {
	layer int
	name  string // an input (w8a8.Inputs) or a projection (w8a8.Projections)
	out   bool
}

// output makes the taps graph outputs, after the stage's own (nil sb or no taps: nothing).
func (sb *stageBuild) output(g *core.Graph) {
	if sb != nil && sb.taps != nil {
		g.Output(sb.taps.tensors...)
	}
}

func (t *tapSet) add(x *core.Tensor, w tapWhat) {
	if t == nil || x == nil || t.seen[x] {
		return
	}
	if t.seen == nil {
		t.seen = map[*core.Tensor]bool{}
	}
	t.seen[x] = true
	t.tensors = append(t.tensors, x)
	t.what = append(t.what, w)
}

// linear is projection p of layer l applied to x [C, K]: the projection hook's (the W8A8
// lowering), or a MATMUL with the model's weight.
func (m *Model) linear(g *core.Graph, sb *stageBuild, x *core.Tensor, l int, p string) *core.Tensor {
	if sb != nil && sb.lin != nil {
		if y := sb.lin.Linear(g, x, l, p); y != nil {
			return y
		}
	}
	y := g.Named(p).MatMul(x, m.w(g, fmt.Sprintf("blk.%d.%s.weight", l, p)))
	if sb != nil {
		sb.taps.add(x, tapWhat{layer: l, name: w8a8.InputOf(p)})
		sb.taps.add(y, tapWhat{layer: l, name: p, out: true})
	}
	return y
}

// w8Mat is one projection's int8 weight and its [N, K] shape.
type w8Mat struct {
	w8a8.Weight
	shape core.Shape
}

// BeginStage implements ProjectionHook: the W8A8 lowering of one stage graph's projections.
func (w *W8A8) BeginStage() ProjectionBuilder {
	return &w8Stage{w: w, quant: map[*core.Tensor]*core.Tensor{}}
}

var _ ProjectionHook = (*W8A8)(nil)

// w8Stage lowers the projections of one stage graph to int8.
type w8Stage struct {
	w *W8A8
	// quant: the I8 tensor of each W8A8 MATMUL input already quantized (projections sharing an
	// input share its QUANTIZE).
	quant map[*core.Tensor]*core.Tensor
}

// Linear implements ProjectionBuilder: QUANTIZE (once per input), MATMUL_W8A8 with the int8
// weight, and with the layer's shadow on, the float product of the input's hot channels added.
func (st *w8Stage) Linear(g *core.Graph, x *core.Tensor, l int, p string) *core.Tensor {
	w := st.w
	name := fmt.Sprintf("blk.%d.%s.weight", l, p)
	iw, ok := w.mats[name]
	if !ok {
		return nil
	}
	in := w.input(l, p)
	q, ok := st.quant[x]
	if !ok {
		q = g.Named(w8a8.InputOf(p)+"_quant").Quantize(x, core.I8, in.Scale)
		st.quant[x] = q
	}
	opts := core.W8A8Options{AScale: in.Scale, Out: core.F32}
	if len(iw.Scales) == 1 {
		opts.BScale = iw.Scales[0]
	} else {
		opts.BScales = g.Const(name+".npu_scale", core.F32, core.Shape{iw.shape[0]}, core.EncodeF32(iw.Scales))
	}
	if so := w.cal.Layers[l].OutAbsMax[p]; so > 0 {
		// the NPU's 16-bit output grid, with headroom for inputs the calibration did not see
		opts.OutScale = outHeadroom * so / 32767
	}
	wq := g.Const(name+".npu_i8", core.I8, iw.shape, iw.Codes)
	y := g.Named(p).MatMulW8A8(q, wq, opts)
	cols, ok := w.cols[name]
	if !w.shadow[l] || !ok {
		return y
	}
	wt := g.Const(name+".shadow_cols", core.F32, core.Shape{cols.c, iw.shape[0]}, cols.wt)
	ids := g.Const(name+".shadow_ids", core.I32, core.Shape{cols.c}, cols.ids)
	s := g.Named(p+"_shadow").ShadowMatMul(x, wt, ids, in.Threshold)
	return g.Named(p+"_shadow_add").Add(y, s)
}

// outHeadroom is how far past the calibrated output maximum the 16-bit output grid reaches.
const outHeadroom = 4
