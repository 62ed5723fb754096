package llm

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// A sharded decode step (sched.Plan's decode shards) cuts every layer the way Megatron-LM's
// tensor parallelism does, so that two units working on one token meet twice a layer instead
// of once per MATMUL:
//
//	shard s:  its KV heads' Q, K, V rows → RoPE → its cache heads → ATTENTION over them →
//	          the attention output projection's matching columns → partial sum o_s
//	rules:    x + Σ o_s → FFN norm
//	shard s:  its neurons' gate and up rows → activation → down projection's matching
//	          columns → partial sum d_s
//	rules:    x + Σ d_s → next layer's attention norm
//
// A shard's Q rows, its K and V heads and its neurons are row ranges of the weights (views of
// the file); its columns of the output and down projections are copied once per model
// (Model.columns). The partial sums are added in shard order, so the result differs from an
// unsharded step by the rounding of that sum only. Only one-token steps are sharded: with one
// row a shard's heads are a contiguous slice of q and of each K/V cache row, bound in place.

// shardCut is a sharded decode's cut of every layer: per shard its KV heads [kv0, kv0+nkv)
// (with their query heads) and its FFN neurons, as pieces [from, from+count) in neuron order
// (one per shard, or with adaptive shards the fixed part and the movable pieces it holds).
type shardCut struct {
	units    []int // plan unit per shard
	kv0, nkv []int64
	ffn      [][][2]int64
	// shared, with stealing shards, are the FFN's pieces instead of ffn: either of the two
	// units runs each (StageSpec.Shared), each taking them from its end.
	shared [][2]int64
}

// Adaptive shards (PlanShards.Adapt) move FFN neurons between the two units from token to
// token: adaptSteps pieces of adaptStep of the neurons on each side of the plan's cut can go
// either way, so there are 2·adaptSteps+1 cuts, each a decode program of its own.
const (
	adaptSteps = 2
	adaptStep  = 0.03
)

// cutShards cuts the model's layers by the plan's shares: KV heads whole, neurons in whole
// blocks of the down projection's quantization (and of 32, a SIMD tile of gate and up rows).
// It returns one cut, or with adaptive shards every cut, unit 0's neurons rising.
func (m *Model) cutShards(ps *sched.PlanShards) ([]*shardCut, error) {
	if err := m.RequireLlamaShape("decode shards"); err != nil {
		return nil, err
	}
	cfg := m.Config
	align := int64(32)
	if w, ok := m.weights["blk.0.ffn_down.weight"]; ok {
		align = max(align, w.dtype.BlockLen())
	}
	base := shardCut{units: ps.Units}
	heads, neurons := ps.Cut(int64(cfg.KVHeads), 1), ps.Cut(int64(cfg.FFN), align)
	var kv, f int64
	var bounds []int64 // where the shards' neurons start, and the end
	for s := range ps.Units {
		if heads[s] == 0 || neurons[s] == 0 {
			return nil, fmt.Errorf("llm: decode shards %v: shard %d gets %d of %d KV heads and %d of %d FFN neurons: %w",
				ps.Ratio, s, heads[s], cfg.KVHeads, neurons[s], cfg.FFN, core.ErrInvalidArgument)
		}
		base.kv0, base.nkv = append(base.kv0, kv), append(base.nkv, heads[s])
		bounds = append(bounds, f)
		kv, f = kv+heads[s], f+neurons[s]
	}
	bounds = append(bounds, f)
	var cuts []*shardCut
	switch {
	case ps.Steal:
		// pieces from each end: a side's share by the fractions, the last piece what is left
		c := base
		mid := bounds[1]
		edges := []int64{0, f} // where pieces meet, from unit 0's end and from unit 1's
		var cum float64
		for _, fr := range ps.StealFractions() {
			cum += fr
			edges = append(edges, min(int64(math.Round(float64(mid)*cum/float64(align)))*align, mid),
				max(f-int64(math.Round(float64(f-mid)*cum/float64(align)))*align, mid))
		}
		slices.Sort(edges)
		edges = slices.Compact(edges)
		for i := 0; i+1 < len(edges); i++ {
			c.shared = append(c.shared, [2]int64{edges[i], edges[i+1] - edges[i]})
		}
		if len(c.shared) < 2 {
			return nil, fmt.Errorf("llm: stealing decode shards: %d FFN neurons make %d piece: %w", cfg.FFN, len(c.shared),
				core.ErrInvalidArgument)
		}
		c.ffn = [][][2]int64{c.shared[:1], c.shared[len(c.shared)-1:]} // for the checks below: where each side starts
		cuts = append(cuts, &c)
	case !ps.Adapt:
		c := base
		for s := range ps.Units {
			c.ffn = append(c.ffn, [][2]int64{{bounds[s], bounds[s+1] - bounds[s]}})
		}
		cuts = append(cuts, &c)
	default:
		// pieces: unit 0's fixed neurons, the movable ones, unit 1's fixed neurons
		step := int64(math.Round(float64(cfg.FFN)*adaptStep/float64(align))) * align
		mid := bounds[1]
		lo, hi := mid-adaptSteps*step, mid+adaptSteps*step
		if len(ps.Units) != 2 || step == 0 || lo <= 0 || hi >= f {
			return nil, fmt.Errorf("llm: adaptive decode shards %v: %d FFN neurons leave no room to move %d pieces of %d on each side of neuron %d: %w",
				ps.Ratio, cfg.FFN, adaptSteps, step, mid, core.ErrInvalidArgument)
		}
		edges := []int64{0}
		for e := lo; e <= hi; e += step {
			edges = append(edges, e)
		}
		edges = append(edges, f)
		for v := 1; v < len(edges)-1; v++ {
			c := base
			c.ffn = make([][][2]int64, 2)
			for i := 0; i+1 < len(edges); i++ {
				s := 0
				if i >= v {
					s = 1
				}
				c.ffn[s] = append(c.ffn[s], [2]int64{edges[i], edges[i+1] - edges[i]})
			}
			cuts = append(cuts, &c)
		}
	}
	// each shard's columns of the two projections must be whole quantization blocks
	group, D := int64(cfg.Heads/cfg.KVHeads), int64(cfg.HeadDim)
	for _, c := range cuts {
		for s := range c.units {
			for name, k0 := range map[string]int64{"attn_output": c.kv0[s] * group * D, "ffn_down": c.ffn[s][0][0]} {
				w, ok := m.weights["blk.0."+name+".weight"]
				if ok && k0%w.dtype.BlockLen() != 0 {
					return nil, fmt.Errorf("llm: decode shards %v: a shard's %s columns from %d are not whole %s blocks: %w",
						ps.Ratio, name, k0, w.dtype, core.ErrUnsupported)
				}
			}
		}
	}
	return cuts, nil
}

// rows is the constant of weight name's rows [r0, r0+n) (a bias's elements): a view of the
// file's bytes.
func (m *Model) rows(g *core.Graph, name string, r0, n int64) *core.Tensor {
	w := m.weights[name]
	shape := append(core.Shape{n}, w.shape[1:]...)
	per := w.dtype.Bytes(shape.NumElements() / n)
	return g.Const(fmt.Sprintf("%s[%d:%d]", name, r0, r0+n), w.dtype, shape, w.data[r0*per:(r0+n)*per])
}

// columns is the constant of weight name's columns [k0, k0+n) of every row: a copy, made once
// per model and range (the upload of a constant is keyed by its bytes).
func (m *Model) columns(g *core.Graph, name string, k0, n int64) *core.Tensor {
	w := m.weights[name]
	rows, k := w.shape[0], w.shape[1]
	key := fmt.Sprintf("%s[:, %d:%d]", name, k0, k0+n)
	m.colMu.Lock()
	data, ok := m.cols[key]
	if !ok {
		row, off, size := w.dtype.Bytes(k), w.dtype.Bytes(k0), w.dtype.Bytes(n)
		data = make([]byte, rows*size)
		for r := range rows {
			copy(data[r*size:(r+1)*size], w.data[r*row+off:r*row+off+size])
		}
		if m.cols == nil {
			m.cols = map[string][]byte{}
		}
		m.cols[key] = data
	}
	m.colMu.Unlock()
	return g.Const(key, w.dtype, core.Shape{rows, n}, data)
}

// columnCache is the Model's store of copied weight columns (Model.columns).
type columnCache struct {
	colMu sync.Mutex
	cols  map[string][]byte
}

// shardName names shard s's nodes in traces and errors.
func shardName(name string, s int) string { return fmt.Sprintf("%s.shard%d", name, s) }

// shardQKV computes layer l's rotated queries and keys and its values of each shard's heads
// from x [1, dim] (the attention norm is applied here, on the rules' unit); sb.shard records
// which nodes are whose.
func (m *Model) shardQKV(g *core.Graph, sc *shardCut, sb *stageBuild, x *core.Tensor, pos posInputs, l int,
	kv kvTypes) (qs, ks, vs []*core.Tensor) {
	cfg := m.Config
	p := fmt.Sprintf("blk.%d.", l)
	h := m.norm(g, x, p+"attn_norm.weight")
	group, D := int64(cfg.Heads/cfg.KVHeads), int64(cfg.HeadDim)
	for s := range sc.units {
		mark := len(g.Nodes)
		proj := func(name string, r0, heads int64) *core.Tensor {
			t := g.Named(shardName(name, s)).MatMul(h, m.rows(g, p+name+".weight", r0*D, heads*D))
			if cfg.QKVBias {
				t = g.Add(t, m.rows(g, p+name+".bias", r0*D, heads*D))
			}
			return g.Reshape(t, 1, heads, D)
		}
		q := m.rope(g, shardName("q_rope", s), proj("attn_q", sc.kv0[s]*group, sc.nkv[s]*group), pos, l)
		k := m.rope(g, shardName("k_rope", s), proj("attn_k", sc.kv0[s], sc.nkv[s]), pos, l)
		v := proj("attn_v", sc.kv0[s], sc.nkv[s])
		qs, ks, vs = append(qs, q), append(ks, toKV(g, k, kv.K)), append(vs, toKV(g, v, kv.V))
		sb.own(g, mark, s)
	}
	return qs, ks, vs
}

// buildShardedEmbedStage is buildEmbedStage for a sharded one-token step: outputs x, then
// each shard's q, k, v.
func (m *Model) buildShardedEmbedStage(sc *shardCut, kv kvTypes, sb *stageBuild) (*core.Graph, error) {
	g := core.NewGraph()
	ids := g.Input("ids", core.I32, 1)
	pos := m.addPosInputs(g, 1)
	x := g.Named("embd").GetRows(m.w(g, "token_embd.weight"), ids)
	g.SetNamePrefix("blk.0.")
	qs, ks, vs := m.shardQKV(g, sc, sb, x, pos, 0, kv)
	g.Output(x)
	for s := range qs {
		g.Output(qs[s], ks[s], vs[s])
	}
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("llm: building the sharded embedding stage: %w", err)
	}
	return g, nil
}

// buildShardedLayerStage is buildLayerStage for a sharded one-token step: inputs x, each
// shard's q ("q.shard<s>"), the caches and the query offset (and the next layer's positions);
// outputs x, then each shard's q, k, v of the next layer (or the logits after the last).
func (m *Model) buildShardedLayerStage(l int, capacity int64, kv kvTypes, sc *shardCut, sb *stageBuild) (*core.Graph, error) {
	cfg := m.Config
	g := core.NewGraph()
	g.SetNamePrefix(fmt.Sprintf("blk.%d.", l))
	group, D := int64(cfg.Heads/cfg.KVHeads), int64(cfg.HeadDim)
	x := g.Input("x", core.F32, 1, int64(cfg.Dim))
	var qs []*core.Tensor
	for s := range sc.units {
		qs = append(qs, g.Input(shardName("q", s), core.F32, 1, sc.nkv[s]*group, D))
	}
	kc := g.Input("k_cache", kv.K, capacity, int64(cfg.KVHeads), D)
	vc := g.Input("v_cache", kv.V, capacity, int64(cfg.KVHeads), D)
	qoff := g.Input("q_offset", core.I32, 1)
	p := fmt.Sprintf("blk.%d.", l)
	scale := float32(1 / math.Sqrt(float64(D)))
	var parts []*core.Tensor
	for s := range sc.units {
		mark := len(g.Nodes)
		nq := sc.nkv[s] * group
		a := g.Named(shardName("attn", s)).Attention(qs[s], kc, vc, core.AttentionOptions{Scale: scale, Causal: true,
			QOffsetInput: qoff, KVHeadOffset: sc.kv0[s], KVHeads: sc.nkv[s]})
		a = g.Reshape(a, 1, nq*D)
		parts = append(parts, g.Named(shardName("attn_output", s)).MatMul(a, m.columns(g, p+"attn_output.weight", sc.kv0[s]*group*D, nq*D)))
		sb.own(g, mark, s)
	}
	x = sumInto(g, "attn_residual", x, parts)

	h := m.norm(g, x, p+"ffn_norm.weight")
	parts = parts[:0]
	for _, pc := range sc.shared {
		mark := len(g.Nodes)
		parts = append(parts, m.ffnPiece(g, h, p, "ffn_piece", pc))
		sb.sharedPiece(g, mark)
	}
	for s := range sc.units {
		if sc.shared != nil {
			break
		}
		mark := len(g.Nodes)
		for _, pc := range sc.ffn[s] {
			parts = append(parts, m.ffnPiece(g, h, p, shardName("ffn", s), pc))
		}
		sb.own(g, mark, s)
	}
	// in neuron order, whichever unit ran a piece: every cut of adaptive shards gives the
	// same sums, so the output does not depend on how the units' speeds moved the cut
	x = sumInto(g, "ffn_residual", x, parts)

	if l+1 < cfg.Layers {
		pos := m.addPosInputs(g, 1)
		g.SetNamePrefix(fmt.Sprintf("blk.%d.", l+1))
		qs, ks, vs := m.shardQKV(g, sc, sb, x, pos, l+1, kv)
		g.Output(x)
		for s := range qs {
			g.Output(qs[s], ks[s], vs[s])
		}
	} else {
		m.outputHead(g, x)
	}
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("llm: building sharded layer %d: %w", l, err)
	}
	return g, nil
}

// ffnPiece is the FFN of neurons [pc[0], pc[0]+pc[1]) of h, layer prefix p: a partial sum of
// the down projection. Its nodes are named name.gate, .up, .act, .down.
func (m *Model) ffnPiece(g *core.Graph, h *core.Tensor, p, name string, pc [2]int64) *core.Tensor {
	f0, nf := pc[0], pc[1]
	gate := g.Named(name+".gate").MatMul(h, m.rows(g, p+"ffn_gate.weight", f0, nf))
	up := g.Named(name+".up").MatMul(h, m.rows(g, p+"ffn_up.weight", f0, nf))
	f := g.Named(name+".act").Mul(m.activation(g, gate), up)
	return g.Named(name+".down").MatMul(f, m.columns(g, p+"ffn_down.weight", f0, nf))
}

// sumInto adds the shards' partial sums to the residual x in shard order (the last add named
// name: the residual the plan's rules and traces know).
func sumInto(g *core.Graph, name string, x *core.Tensor, parts []*core.Tensor) *core.Tensor {
	for i, p := range parts {
		if i == len(parts)-1 {
			g.Named(name)
		}
		x = g.Add(x, p)
	}
	return x
}

// shardBindings binds stage s's shard tensors of a one-token step: per shard its slice of q
// read (qIn, the lanes of the q the stage reads) and written (qOut), and its heads of layer s's
// K and V cache rows (strided by the row, as the unsharded K and V outputs).
func (sc *shardCut) shardBindings(r *Runner, qIn, qOut []sched.Span, s int) ([][4]sched.Binding, error) {
	cfg := r.m.Config
	group, D := int64(cfg.Heads/cfg.KVHeads), int64(cfg.HeadDim)
	headBytes := [2]int64{r.cfg.kv.K.Bytes(D), r.cfg.kv.V.Bytes(D)}
	lanes := func(spans []sched.Span, off, size int64) ([]sched.Span, error) {
		out := make([]sched.Span, len(spans))
		for l, sp := range spans {
			var err error
			if out[l], err = sp.Slice(off, size); err != nil {
				return nil, fmt.Errorf("llm: shard bindings: %w", err)
			}
		}
		return out, nil
	}
	var out [][4]sched.Binding
	for sh := range sc.units {
		qOff, qSize := sc.kv0[sh]*group*D*4, sc.nkv[sh]*group*D*4
		in, err := lanes(qIn, qOff, qSize)
		if err != nil {
			return nil, err
		}
		qo, err := lanes(qOut, qOff, qSize)
		if err != nil {
			return nil, err
		}
		b := [4]sched.Binding{{Lanes: in}, {Lanes: qo}}
		if s < cfg.Layers {
			for i := range 2 {
				off := sc.kv0[sh] * headBytes[i]
				kv, err := r.kv[s][i].Slice(off, r.kv[s][i].Size-off)
				if err != nil {
					return nil, fmt.Errorf("llm: shard bindings: %w", err)
				}
				b[2+i] = sched.Binding{Span: kv, Stride: int64(cfg.KVHeads) * headBytes[i]}
			}
		}
		out = append(out, b)
	}
	return out, nil
}

// build is the sharded embedding stage or layer stage s-1 (stageHook).
func (sc *shardCut) build(r *Runner, s int, sb *stageBuild) (*core.Graph, error) {
	if s == 0 {
		return r.m.buildShardedEmbedStage(sc, r.cfg.kv, sb)
	}
	return r.m.buildShardedLayerStage(s-1, r.cap, r.cfg.kv, sc, sb)
}

// unit is shard i's plan unit (stageHook).
func (sc *shardCut) unit(i int) int { return sc.units[i] }

// bind binds each shard's slice of q as "q.shard<s>" and returns, but after the last layer,
// each shard's q and its heads of the K and V rows, written in place (stageHook).
func (sc *shardCut) bind(r *Runner, s int, qIn, qOut []sched.Span, byName map[string]sched.Binding) ([]sched.Binding, error) {
	io, err := sc.shardBindings(r, qIn, qOut, s)
	if err != nil {
		return nil, err
	}
	var out []sched.Binding
	for sh, b := range io {
		byName[shardName("q", sh)] = b[0]
		if s < r.m.Config.Layers {
			out = append(out, b[1:]...)
		}
	}
	return out, nil
}

// spec marks the stage sharded and, with stealing shards, names the two units that share
// its pieces (stageHook).
func (sc *shardCut) spec(r *Runner, st *sched.StageSpec) {
	st.Sharded = true
	if len(st.Shared) > 0 {
		st.SharedUnits = [2]int{r.unitIdx[sc.units[0]], r.unitIdx[sc.units[1]]}
	}
}

// shardAdapt moves adaptive shards' cut (PlanShards.Adapt): after each decode step it compares
// the two units' busy times and, when one has been busier by more than moving a piece of
// neurons would shift, runs the next steps with the cut one piece over.
type shardAdapt struct {
	cuts  []*shardCut
	progs []*chunkProg // the decode program of each cut
	cur   int
	diff  float64 // moving average of unit 0's busy time less unit 1's per step, in seconds
	since int     // steps since the cut last moved
	moves int
}

// prepare makes the decode program of every cut but the current one, which init prepared.
func (a *shardAdapt) prepare(ctx context.Context, r *Runner, step func()) error {
	a.progs = make([]*chunkProg, len(a.cuts))
	a.progs[a.cur] = r.progs[1]
	defer func() { r.shards = a.cuts[a.cur] }()
	for i, c := range a.cuts {
		if i == a.cur {
			continue
		}
		r.shards = c // what prepare builds
		cp, err := r.prepare(ctx, 1, step, false)
		if err != nil {
			return err
		}
		a.progs[i] = cp
	}
	return nil
}

// adaptSettle is how many steps the cut stays before it may move again: the average must
// first see the new cut's times.
const adaptSettle = 4

// observe takes the decode step that just ran and picks the cut for the next one.
func (a *shardAdapt) observe(r *Runner) {
	busy := a.progs[a.cur].prog.LastRun().Busy
	u0, u1 := r.unitIdx[a.cuts[0].units[0]], r.unitIdx[a.cuts[0].units[1]]
	if u0 >= len(busy) || u1 >= len(busy) {
		return
	}
	b0, b1 := busy[u0].Seconds(), busy[u1].Seconds()
	d := b0 - b1
	if a.since == 0 {
		a.diff = d
	} else {
		a.diff = 0.7*a.diff + 0.3*d
	}
	a.since++
	// a piece is adaptStep of the neurons; the FFN is most of a layer's weights, so moving it
	// shifts about that share of the two units' busy time from one to the other
	shift := adaptStep * 0.8 * (b0 + b1)
	next := a.cur
	switch {
	case a.since < adaptSettle:
	case a.diff > shift && a.cur > 0:
		next = a.cur - 1
	case a.diff < -shift && a.cur < len(a.cuts)-1:
		next = a.cur + 1
	}
	if next != a.cur {
		a.cur, a.since = next, 0
		a.moves++
		r.shards, r.progs[1] = a.cuts[next], a.progs[next]
		r.cfg.logger.Debug("llm: adaptive shards moved their cut", "unit0_neurons", neurons(a.cuts[next].ffn[0]),
			"busy0", b0, "busy1", b1, "moves", a.moves)
	}
}

// neurons counts the neurons of pieces.
func neurons(pieces [][2]int64) int64 {
	var n int64
	for _, p := range pieces {
		n += p[1]
	}
	return n
}
