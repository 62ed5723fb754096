package w8a8

import (
	"fmt"
	"slices"
	"strings"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
)

// Lowering is a model lowered for an int8 NPU: per W8A8 MATMUL, QUANTIZE(x → I8, sa) (one per
// distinct input) and an int8 × int8 MATMUL (the NPU's part), and in the layers with a shadow
// path SHADOW_MATMUL(x, the hot channels' float weight columns, their ids, 127·sa) added to it
// (the CPU's part). The embedding and the output head stay as they are. Use it with WithLowering.
type Lowering struct {
	cal    *Calibration
	gran   Granularity
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

// NewLowering checks cfg's calibration against m (its key and shape: a stale one is an error
// wrapping ErrStale), reads or converts the int8 weights and gathers the hot weight
// columns.
func NewLowering(m *llm.Model, cfg Config) (*Lowering, error) {
	c := m.Config
	if cfg.Calibration == nil {
		return nil, fmt.Errorf("w8a8: Lowering needs a calibration (xpu calibrate): %w", core.ErrInvalidArgument)
	}
	if err := cfg.Calibration.Validate(ModelKey(m.File), c.Arch, c.Dim, c.FFN, c.Layers); err != nil {
		return nil, fmt.Errorf("w8a8: %w", err)
	}
	if _, err := HasLayout(m.File); err != nil {
		return nil, fmt.Errorf("w8a8: %w", err)
	}
	w := &Lowering{cal: cfg.Calibration, gran: cfg.Granularity, mats: map[string]w8Mat{}, cols: map[string]shadowCols{},
		shadow: make([]bool, c.Layers)}
	switch {
	case cfg.ShadowLayers != nil:
		if len(cfg.ShadowLayers) != c.Layers {
			return nil, fmt.Errorf("w8a8: %d shadow layer flags for %d layers: %w", len(cfg.ShadowLayers), c.Layers, core.ErrInvalidArgument)
		}
		copy(w.shadow, cfg.ShadowLayers)
	case cfg.Shadow == ShadowOn:
		for l := range w.shadow {
			w.shadow[l] = true
		}
	case cfg.Shadow == ShadowPruned:
		for l, ly := range cfg.Calibration.Layers {
			w.shadow[l] = ly.Shadow
		}
	case cfg.Shadow != ShadowOff:
		return nil, fmt.Errorf("w8a8: shadow mode %v: %w", cfg.Shadow, core.ErrInvalidArgument)
	}
	for l := range c.Layers {
		for _, p := range Projections {
			name := fmt.Sprintf("blk.%d.%s.weight", l, p)
			ww, ok := m.Weight(name)
			if !ok {
				return nil, fmt.Errorf("w8a8: tensor %s: %w", name, core.ErrNotFound)
			}
			n, k := int(ww.Shape[0]), int(ww.Shape[1])
			q, g, ok, err := FromFile(m.File, name)
			if err != nil {
				return nil, fmt.Errorf("w8a8: %w", err)
			}
			var xs []float32
			if !ok {
				if !cfg.Convert {
					return nil, fmt.Errorf("w8a8: %s: %w", name, ErrNoInt8)
				}
				if xs, err = core.Dequantize(ww.DType, ww.Data, 0); err != nil {
					return nil, fmt.Errorf("w8a8: %s: %w", name, err)
				}
				if q, err = QuantizeWeight(xs, n, k, cfg.Granularity); err != nil {
					return nil, fmt.Errorf("w8a8: %s: %w", name, err)
				}
				g = cfg.Granularity
			} else {
				w.fromFile = true
			}
			w.gran = g
			w.mats[name] = w8Mat{Weight: q, shape: ww.Shape}
			hot := w.input(l, p).Hot
			if !w.shadow[l] || len(hot) == 0 {
				continue
			}
			if xs == nil {
				if xs, err = core.Dequantize(ww.DType, ww.Data, 0); err != nil {
					return nil, fmt.Errorf("w8a8: %s: %w", name, err)
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
func (w *Lowering) input(l int, p string) Input {
	in := InputOf(p)
	return w.cal.Layers[l].Inputs[slices.Index(Inputs, in)]
}

// ShadowLayers says which layers run the shadow path.
func (w *Lowering) ShadowLayers() []bool { return slices.Clone(w.shadow) }

// Granularity is the weights' scale granularity.
func (w *Lowering) Granularity() Granularity { return w.gran }

// Calibration is the calibration in use.
func (w *Lowering) Calibration() *Calibration { return w.cal }

// ShadowWork is the share of the full shadow work kept: hot channels of layers with a shadow
// path over hot channels of every layer (1 with every layer on, 0 without outliers).
func (w *Lowering) ShadowWork() float64 {
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
func (w *Lowering) Describe() string {
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
	return fmt.Sprintf("Lowering (per-%s int8 weights %s), shadow layers %s (%.0f%% of the shadow work)",
		w.gran, src, layers, 100*w.ShadowWork())
}

// w8Mat is one projection's int8 weight and its [N, K] shape.
type w8Mat struct {
	Weight
	shape core.Shape
}

// BeginStage implements llm.ProjectionHook: the W8A8 lowering of one stage graph's projections.
func (w *Lowering) BeginStage() llm.ProjectionBuilder {
	return &w8Stage{w: w, quant: map[*core.Tensor]*core.Tensor{}}
}

var _ llm.ProjectionHook = (*Lowering)(nil)

// w8Stage lowers the projections of one stage graph to int8.
type w8Stage struct {
	w *Lowering
	// quant: the I8 tensor of each W8A8 MATMUL input already quantized (projections sharing an
	// input share its QUANTIZE).
	quant map[*core.Tensor]*core.Tensor
}

// Linear implements llm.ProjectionBuilder: QUANTIZE (once per input), MATMUL_W8A8 with the int8
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
		q = g.Named(InputOf(p)+"_quant").Quantize(x, core.I8, in.Scale)
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

// WithLowering runs the seven projections of every layer as w's W8A8 lowering (NewLowering): an int8
// MATMUL, which a plan places on an NPU unit, and QUANTIZE and the shadow path
// (SHADOW_MATMUL + ADD), which it places on a CPU unit (Plan).
func WithLowering(w *Lowering) llm.RunnerOption {
	if w == nil {
		return llm.WithProjectionHook(nil)
	}
	return llm.WithProjectionHook(w)
}
