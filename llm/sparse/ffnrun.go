package sparse

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/llm/sparse/host"
	"github.com/xpuhub/xpu/sched"
)

// The sparse FFN's graphs (WithFFN, a chunk hook of package llm). A layer is cut at its FFN, because which bundles the
// FFN uses is decided on the host from the FFN input:
//
//	embed:    ids, pos → embedding → x and layer 0's q, k, v               (as the dense stage 0)
//	attn l:   x, q, K/V cache, q_offset → attention → x1 = x + o, h = ffn_norm(x1)
//	          [, the predictor's logits B·relu(A·h) + bias]
//	          (host: Select → now, later; the cold bundles of later start loading)
//	ffn l:    h, cache, now → a = SPARSE_FFN over the resident bundles   (while the I/O runs)
//	          (host: wait for later's bundles)
//	tail l:   x1, h, a, cache, later [, pos] → x = x1 + a + SPARSE_FFN over the loaded bundles,
//	          then layer l+1's q, k, v (or, after the last layer, the logits)
//
// Each graph is a one-stage program on the runner's single unit; the runner runs them in order
// and calls the SparseFFN between them. The cache is one arena span of Rows bundle rows that
// every layer's SPARSE_FFN reads; the index lists are arena spans the host rewrites per layer.

// sparseProg is the sparse programs for one chunk length.
type sparseProg struct {
	fp     *ffnPrograms
	c      int64
	embed  *sched.Program
	layers []sparseLayer
	// activations (one chunk in flight: the programs run one after the other)
	x1, h, ffa, logits, pred, predNext sched.Span
	now, later                         sched.Span
	// the host's index lists and views of h and the logits, reused per layer
	nowIdx, laterIdx      []int32
	hBuf, predBuf, nxtBuf []float32
}

// PhaseTimes is where a sparse runner's time went, summed over every layer of every chunk run
// so far (TimesOf): the attention graphs (with the next layer's q, k, v this is all
// the dense work), Select (the host's selection, queuing the reads), the FFN over the resident
// rows (now), waiting for the cold reads, and the tail (the FFN over the rows just read, the
// residual and the next layer's projections). Embed is the embedding graph.
type PhaseTimes struct {
	Embed, Attn, Select, Now, Wait, Tail time.Duration
	// Layers counts the layer steps timed.
	Layers int64
}

// Total is the sum of the parts.
func (t PhaseTimes) Total() time.Duration {
	return t.Embed + t.Attn + t.Select + t.Now + t.Wait + t.Tail
}

// String is one line of milliseconds and shares.
func (t PhaseTimes) String() string {
	tot := t.Total()
	pc := func(d time.Duration) float64 {
		if tot == 0 {
			return 0
		}
		return 100 * float64(d) / float64(tot)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return fmt.Sprintf("%d layer steps, %.0f ms: attention %.0f ms (%.0f%%), select %.0f ms (%.0f%%), FFN over resident rows %.0f ms (%.0f%%), "+
		"wait for reads %.0f ms (%.0f%%), tail %.0f ms (%.0f%%), embed %.0f ms", t.Layers, ms(tot), ms(t.Attn), pc(t.Attn),
		ms(t.Select), pc(t.Select), ms(t.Now), pc(t.Now), ms(t.Wait), pc(t.Wait), ms(t.Tail), pc(t.Tail), ms(t.Embed))
}

// TimesOf returns where a runner's sparse programs' time went so far, in chunks of several
// tokens (prefill) and one token (decode); zero for a runner without the sparse FFN.
func TimesOf(r *llm.Runner) (prefill, decode PhaseTimes) {
	if fp, ok := r.ChunkPrograms().(*ffnPrograms); ok {
		return fp.times[0], fp.times[1]
	}
	return PhaseTimes{}, PhaseTimes{}
}

// sparseLayer is one layer's three programs (ffn is nil when every neuron is resident).
type sparseLayer struct{ attn, ffn, tail *sched.Program }

// programs lists every program, for Close.
func (sp *sparseProg) programs() []*sched.Program {
	out := []*sched.Program{sp.embed}
	for _, l := range sp.layers {
		out = append(out, l.attn, l.tail)
		if l.ffn != nil {
			out = append(out, l.ffn)
		}
	}
	return out
}

// sparseAct maps the model's FFN activation to SPARSE_FFN's; a SiLU model has no sparse FFN.
func sparseAct(a arch.Activation) (core.SparseAct, bool) {
	switch a {
	case arch.ActReLU:
		return core.SparseReLU, true
	case arch.ActReLU2:
		return core.SparseReLU2, true
	}
	return 0, false
}

// WithFFN runs every layer's FFN sparsely through f (see host.FFN): a chunk hook of the runner
// (llm.WithChunkHook) that cuts each layer at its FFN. The model must have a ReLU-family FFN
// activation; the runner then runs on one unit, one chunk at a time.
func WithFFN(f host.FFN) llm.RunnerOption { return llm.WithChunkHook(ffnHook{f}) }

// ffnHook is the sparse FFN as a chunk hook.
type ffnHook struct{ ffn host.FFN }

// ffnPrograms is the sparse FFN's part of one runner: the bundle cache every layer's SPARSE_FFN
// reads and where its runs' time went.
type ffnPrograms struct {
	s     *llm.Seam
	r     *llm.Runner
	ffn   host.FFN
	cache sched.Span
	times [2]PhaseTimes // chunks of several tokens, of one
}

// Attach implements llm.ChunkHook: it checks the layout against the model, allocates the
// bundle cache and has the FFN fill it.
func (h ffnHook) Attach(ctx context.Context, s *llm.Seam) (llm.ChunkPrograms, error) {
	r := s.Runner()
	m := r.Model()
	if err := m.RequireLlamaShape("the sparse FFN"); err != nil {
		return nil, err
	}
	lay := h.ffn.Layout()
	c := m.Config
	act, ok := sparseAct(c.Activation)
	switch {
	case !ok:
		return nil, fmt.Errorf("sparse: the model's FFN activation is %s; only the ReLU family is sparse: %w",
			c.Activation, core.ErrUnsupported)
	case lay.Act != act || lay.Ungated:
		return nil, fmt.Errorf("sparse: bundles are for activation %d (ungated %t), the model's FFN is gated %s: %w",
			lay.Act, lay.Ungated, c.Activation, core.ErrInvalidArgument)
	case lay.Neurons != c.FFN || lay.Rows < 1 || lay.RowLen < 3*int64(c.Dim):
		return nil, fmt.Errorf("sparse: layout of %d neurons, %d rows of %d values does not fit the model (FFN %d, dim %d): %w",
			lay.Neurons, lay.Rows, lay.RowLen, c.FFN, c.Dim, core.ErrInvalidArgument)
	case len(lay.Predictors) != 0 && len(lay.Predictors) != c.Layers:
		return nil, fmt.Errorf("sparse: %d predictors for %d layers: %w", len(lay.Predictors), c.Layers, core.ErrInvalidArgument)
	case len(r.Units()) != 1:
		return nil, fmt.Errorf("sparse: the sparse FFN runs on one unit, the plan has %d: %w", len(r.Units()), core.ErrUnsupported)
	}
	for l, p := range lay.Predictors {
		F, D := int64(lay.Neurons), int64(c.Dim)
		if p.Rank < 1 || int64(len(p.A)) != 2*int64(p.Rank)*D || int64(len(p.B)) != 2*F*int64(p.Rank) || int64(len(p.Bias)) != 4*F {
			return nil, fmt.Errorf("sparse: layer %d's predictor (rank %d) has %d/%d/%d bytes of A/B/bias: %w",
				l, p.Rank, len(p.A), len(p.B), len(p.Bias), core.ErrInvalidArgument)
		}
	}
	rowBytes := lay.DType.Bytes(lay.RowLen)
	a := r.Runtime().Arena()
	if lay.Rows > math.MaxInt64/rowBytes {
		return nil, fmt.Errorf("sparse: FFN cache of %d rows: %w", lay.Rows, core.ErrInvalidArgument)
	}
	cache, err := a.Alloc(lay.Rows * rowBytes)
	if err != nil {
		return nil, fmt.Errorf("sparse: FFN cache of %d rows (%d MiB): %w", lay.Rows, lay.Rows*rowBytes>>20, err)
	}
	if err := h.ffn.Load(ctx, a.Bytes(cache)); err != nil {
		return nil, fmt.Errorf("sparse: loading the resident bundles: %w", err)
	}
	return &ffnPrograms{s: s, r: r, ffn: h.ffn, cache: cache}, nil
}

// Describe implements llm.ChunkPrograms.
func (fp *ffnPrograms) Describe(c int64) string {
	phase := "prefill"
	if c == 1 {
		phase = "decode"
	}
	return fmt.Sprintf("%s (chunk %d): every stage on %s, the FFN as SPARSE_FFN over %d cached bundle rows",
		phase, c, fp.r.Units()[0], fp.ffn.Layout().Rows)
}

// Prepare implements llm.ChunkPrograms: it builds and prepares the sparse programs for chunk
// length c.
func (fp *ffnPrograms) Prepare(ctx context.Context, c int64) (llm.ChunkProgram, error) {
	s := fp.s
	m := fp.r.Model()
	cfg := m.Config
	lay := fp.ffn.Layout()
	a := fp.r.Runtime().Arena()
	al := a.Allocs()
	alloc := al.Alloc
	dim := int64(cfg.Dim)
	sp := &sparseProg{fp: fp, c: c}
	x, q := alloc(c*dim*4), alloc(c*int64(cfg.Heads*cfg.HeadDim)*4)
	sp.x1, sp.h, sp.ffa = alloc(c*dim*4), alloc(c*dim*4), alloc(c*dim*4)
	sp.logits = alloc(c * int64(cfg.Vocab) * 4)
	sp.now, sp.later = alloc(4*int64(lay.Neurons)), alloc(4*int64(lay.Neurons))
	if len(lay.Predictors) > 0 {
		sp.pred = alloc(c * int64(lay.Neurons) * 4)
		if lay.LookAhead {
			sp.predNext = alloc(c * int64(lay.Neurons) * 4)
		}
	}
	err := al.Err
	if err != nil {
		return nil, fmt.Errorf("sparse: activations for chunk %d: %w", c, err)
	}
	if lay.AllResident {
		clear(a.Bytes(sp.ffa)) // the tail adds it, and no FFN program writes it
	}
	kv := s.KVTypes()
	st := arch.Stage{C: c, Capacity: s.Capacity(), K: kv.K, V: kv.V}
	byName := map[string]sched.Binding{
		"x": {Span: x}, "q": {Span: q}, "x1": {Span: sp.x1}, "h": {Span: sp.h}, "ffn_a": {Span: sp.ffa},
		"bundles": {Span: fp.cache}, "now": {Span: sp.now}, "later": {Span: sp.later},
	}
	kvOut := func(l int) []sched.Binding {
		k, v := s.KV(l, true)
		return []sched.Binding{k, v}
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, sp.Close())
		}
	}()
	g := core.NewGraph()
	if err = st.Embed(m.Block(g)); err != nil {
		return nil, err
	}
	if sp.embed, err = s.Compile(ctx, c, "embed", 0, g, byName, append([]sched.Binding{{Span: x}, {Span: q}}, kvOut(0)...)...); err != nil {
		return nil, err
	}
	s.Step()
	for l := range cfg.Layers {
		var ly sparseLayer
		byName["k_cache"], byName["v_cache"] = s.KV(l, false)
		if g, err = buildAttn(m, l, st, lay); err != nil {
			return nil, err
		}
		outs := []sched.Binding{{Span: sp.x1}, {Span: sp.h}}
		if len(lay.Predictors) > 0 {
			outs = append(outs, sched.Binding{Span: sp.pred})
			if lookAhead(lay, l, cfg.Layers) {
				outs = append(outs, sched.Binding{Span: sp.predNext})
			}
		}
		if ly.attn, err = s.Compile(ctx, c, fmt.Sprintf("attn %d", l), l, g, byName, outs...); err != nil {
			return nil, err
		}
		if !lay.AllResident {
			if g, err = buildFFN(m, l, c, lay); err != nil {
				return nil, err
			}
			if ly.ffn, err = s.Compile(ctx, c, fmt.Sprintf("ffn %d", l), l, g, byName, sched.Binding{Span: sp.ffa}); err != nil {
				return nil, err
			}
		}
		if g, err = buildTail(m, l, st, lay); err != nil {
			return nil, err
		}
		outs = []sched.Binding{{Span: sp.logits}}
		if l+1 < cfg.Layers {
			outs = append([]sched.Binding{{Span: x}, {Span: q}}, kvOut(l+1)...)
		}
		if ly.tail, err = s.Compile(ctx, c, fmt.Sprintf("tail %d", l), l, g, byName, outs...); err != nil {
			return nil, err
		}
		sp.layers = append(sp.layers, ly)
		s.Step()
	}
	return sp, nil
}

// Logits implements llm.ChunkProgram.
func (sp *sparseProg) Logits() sched.Span { return sp.logits }

// Close implements llm.ChunkProgram.
func (sp *sparseProg) Close() error {
	var errs []error
	for _, p := range sp.programs() {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	return errors.Join(errs...)
}

// Run implements llm.ChunkProgram: it runs one chunk at row, of which the first rows are real
// tokens (the rest padding), through the sparse programs; the logits are then in sp.logits.
func (sp *sparseProg) Run(ctx context.Context, row int64, rows int) error {
	fp := sp.fp
	a := fp.r.Runtime().Arena()
	lay := fp.ffn.Layout()
	ch := []sched.Chunk{{Row: row}}
	run := func(p *sched.Program) error {
		if err := p.Run(ctx, ch); err != nil {
			return fmt.Errorf("sparse: %s at position %d: %w", p.Name(), row, err)
		}
		return nil
	}
	tm := &fp.times[0]
	if sp.c == 1 {
		tm = &fp.times[1]
	}
	t0 := time.Now()
	lap := func(d *time.Duration) {
		t := time.Now()
		*d += t.Sub(t0)
		t0 = t
	}
	if err := run(sp.embed); err != nil {
		return err
	}
	lap(&tm.Embed)
	F, D := int64(lay.Neurons), int64(fp.r.Model().Config.Dim)
	if sp.nowIdx == nil {
		sp.nowIdx, sp.laterIdx = make([]int32, F), make([]int32, F)
	}
	now, later := sp.nowIdx, sp.laterIdx
	for l, ly := range sp.layers {
		if err := run(ly.attn); err != nil {
			return err
		}
		lap(&tm.Attn)
		// Only the real rows: a padding row's h would add neurons (and reads) nobody needs.
		sp.hBuf = core.DecodeF32To(sp.hBuf, a.Bytes(sp.h)[:int64(rows)*D*4])
		var logits, next []float32
		if len(lay.Predictors) > 0 {
			sp.predBuf = core.DecodeF32To(sp.predBuf, a.Bytes(sp.pred)[:int64(rows)*F*4])
			logits = sp.predBuf
			if lookAhead(lay, l, len(sp.layers)) {
				sp.nxtBuf = core.DecodeF32To(sp.nxtBuf, a.Bytes(sp.predNext)[:int64(rows)*F*4])
				next = sp.nxtBuf
			}
		}
		wait, err := fp.ffn.Select(ctx, l, sp.hBuf, logits, next, now, later)
		if err != nil {
			return fmt.Errorf("sparse: sparse FFN of layer %d at position %d: %w", l, row, err)
		}
		if lay.AllResident {
			// Nothing is ever read: the tail's FFN takes now's rows, and ffn_a stays 0.
			core.PutI32(a.Bytes(sp.later), now)
			lap(&tm.Select)
		} else {
			core.PutI32(a.Bytes(sp.now), now)
			core.PutI32(a.Bytes(sp.later), later)
			lap(&tm.Select)
			if err := run(ly.ffn); err != nil {
				return errors.Join(err, wait())
			}
			lap(&tm.Now)
		}
		if err := wait(); err != nil {
			return fmt.Errorf("sparse: sparse FFN of layer %d at position %d: loading bundles: %w", l, row, err)
		}
		lap(&tm.Wait)
		if err := run(ly.tail); err != nil {
			return err
		}
		lap(&tm.Tail)
		tm.Layers++
	}
	return nil
}

// buildAttn builds layer l's attention graph of stage shape st: x1 (the residual after
// attention), h (the FFN input) and, with predictors, their logits.
func buildAttn(m *llm.Model, l int, st arch.Stage, lay host.Layout) (*core.Graph, error) {
	cfg := m.Config
	g := core.NewGraph()
	b := m.Block(g)
	g.SetNamePrefix(fmt.Sprintf("blk.%d.", l))
	H, D := int64(cfg.Heads), int64(cfg.HeadDim)
	in := st.LayerInputs(g, &cfg)
	at := g.Named("attn").Attention(in.Q, in.KCache, in.VCache, core.AttentionOptions{
		Scale: float32(1 / math.Sqrt(float64(D))), Causal: true, QOffsetInput: in.QOffset})
	at = g.Reshape(at, st.C, H*D)
	o := b.Linear(at, l, "attn_output")
	x1 := g.Named("attn_residual").Add(in.X, o)
	h := b.Norm(x1, fmt.Sprintf("blk.%d.ffn_norm.weight", l))
	outs := []*core.Tensor{x1, h}
	if len(lay.Predictors) > 0 {
		predict := func(pl int, name string) *core.Tensor {
			p := lay.Predictors[pl]
			F, r := int64(lay.Neurons), int64(p.Rank)
			pa := g.Const(fmt.Sprintf("blk.%d.pred_a", pl), core.F16, core.Shape{r, int64(cfg.Dim)}, p.A)
			pb := g.Const(fmt.Sprintf("blk.%d.pred_b", pl), core.F16, core.Shape{F, r}, p.B)
			bias := g.Const(fmt.Sprintf("blk.%d.pred_bias", pl), core.F32, core.Shape{F}, p.Bias)
			z := g.Named(name + "_relu").ReLU(g.Named(name+"_a").MatMul(h, pa))
			return g.Named(name+"_logits").Add(g.Named(name+"_b").MatMul(z, pb), bias)
		}
		outs = append(outs, predict(l, "pred"))
		if lookAhead(lay, l, cfg.Layers) {
			outs = append(outs, predict(l+1, "pred_next"))
		}
	}
	g.Output(outs...)
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("sparse: building layer %d's sparse attention: %w", l, err)
	}
	return g, nil
}

// lookAhead says whether layer l's attention graph also computes layer l+1's predictor.
func lookAhead(lay host.Layout, l, layers int) bool {
	return lay.LookAhead && len(lay.Predictors) > 0 && l+1 < layers
}

// sparseInputs adds the bundle cache and an index list input.
func sparseInputs(g *core.Graph, lay host.Layout, idx string) (bundles, list *core.Tensor) {
	return g.Input("bundles", lay.DType, lay.Rows, lay.RowLen), g.Input(idx, core.I32, int64(lay.Neurons))
}

// buildFFN builds layer l's SPARSE_FFN over the resident bundles ("now").
func buildFFN(m *llm.Model, l int, c int64, lay host.Layout) (*core.Graph, error) {
	g := core.NewGraph()
	g.SetNamePrefix(fmt.Sprintf("blk.%d.", l))
	h := g.Input("h", core.F32, c, int64(m.Config.Dim))
	b, now := sparseInputs(g, lay, "now")
	g.Output(g.Named("ffn_sparse").SparseFFN(h, b, now, core.SparseFFNOptions{Act: lay.Act}))
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("sparse: building layer %d's sparse FFN: %w", l, err)
	}
	return g, nil
}

// buildTail builds the rest of layer l: SPARSE_FFN over the bundles just loaded
// ("later"), the residual, then layer l+1's q, k, v or the logits (st.Next).
func buildTail(m *llm.Model, l int, st arch.Stage, lay host.Layout) (*core.Graph, error) {
	cfg, c := m.Config, st.C
	g := core.NewGraph()
	g.SetNamePrefix(fmt.Sprintf("blk.%d.", l))
	dim := int64(cfg.Dim)
	x1 := g.Input("x1", core.F32, c, dim)
	h := g.Input("h", core.F32, c, dim)
	fa := g.Input("ffn_a", core.F32, c, dim)
	b, later := sparseInputs(g, lay, "later")
	fb := g.Named("ffn_sparse_later").SparseFFN(h, b, later, core.SparseFFNOptions{Act: lay.Act})
	st.Next(m.Block(g), g.Named("ffn_residual").Add(g.Add(x1, fa), fb), l)
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("sparse: building layer %d's sparse tail: %w", l, err)
	}
	return g, nil
}
