package shard

import (
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/llm/kvcache"
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
// (llm.Model.Columns). The partial sums are added in shard order, so the result differs from an
// unsharded step by the rounding of that sum only. Only one-token steps are sharded: with one
// row a shard's heads are a contiguous slice of q and of each K/V cache row, bound in place.

// Importing the package lets runners run plans with decode shards (llm.RegisterShards).
func init() { llm.RegisterShards(NewDecode) }

// NewDecode cuts m's layers by the plan's shares ps (Cuts) into the stage hooks of a runner's
// decode programs (llm.ShardsFunc): one cut, or with adaptive shards every cut, the middle one
// first.
func NewDecode(m *llm.Model, ps *sched.PlanShards) (llm.ShardedDecode, error) {
	if err := m.RequireLlamaShape("decode shards"); err != nil {
		return nil, err
	}
	cfg := m.Config
	d := Dims{KVHeads: int64(cfg.KVHeads), Heads: int64(cfg.Heads), HeadDim: int64(cfg.HeadDim), FFN: int64(cfg.FFN)}
	if w, ok := m.Weight("blk.0.attn_output.weight"); ok {
		d.AttnOutput = w.DType
	}
	if w, ok := m.Weight("blk.0.ffn_down.weight"); ok {
		d.FFNDown = w.DType
	}
	cuts, err := Cuts(ps, d)
	if err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}
	a := &decode{cur: len(cuts) / 2}
	for _, c := range cuts {
		a.cuts = append(a.cuts, &cutHook{Cut: c, m: m})
	}
	return a, nil
}

// Without is p without decode shards: for W8A8 weights and the sparse FFN, which shards do not
// run.
func Without(p *sched.Plan) *sched.Plan {
	if p.Decode.Shards == nil {
		return p
	}
	out := *p
	out.Decode.Shards = nil
	return &out
}

// cutHook builds and binds a runner's decode stages by one cut (llm.StageHook).
type cutHook struct {
	*Cut
	m *llm.Model
}

// shardName names shard s's nodes in traces and errors.
func shardName(name string, s int) string { return fmt.Sprintf("%s.shard%d", name, s) }

// rows is the constant of weight name's rows [r0, r0+n) (a bias's elements): a view of the
// file's bytes.
func rows(m *llm.Model, g *core.Graph, name string, r0, n int64) *core.Tensor {
	w, _ := m.Weight(name)
	shape := append(core.Shape{n}, w.Shape[1:]...)
	per := w.DType.Bytes(shape.NumElements() / n)
	return g.Const(fmt.Sprintf("%s[%d:%d]", name, r0, r0+n), w.DType, shape, w.Data[r0*per:(r0+n)*per])
}

// stage is a stage graph being built and the placement of its shards' nodes.
type stage struct{ llm.HookStage }

// own records the nodes g added from mark on as shard s's.
func (st *stage) own(mark, s int, units []int) {
	for _, n := range st.Graph.Nodes[mark:] {
		st.Units[n.ID] = units[s]
	}
}

// sharedPiece records the nodes g added from mark on as a piece either shard unit may run
// (StageSpec.Shared).
func (st *stage) sharedPiece(mark int) {
	var ids []int
	for _, n := range st.Graph.Nodes[mark:] {
		ids = append(ids, n.ID)
	}
	st.Shared = append(st.Shared, ids)
}

// qkv computes layer l's rotated queries and keys and its values of each shard's heads from
// x [1, dim] (the attention norm is applied here, on the rules' unit).
func (c *cutHook) qkv(st *stage, x *core.Tensor, pos arch.Pos, l int, kv kvcache.Types) (qs, ks, vs []*core.Tensor) {
	m, g, cfg := c.m, st.Graph, c.m.Config
	p := fmt.Sprintf("blk.%d.", l)
	h := m.Block(g).Norm(x, p+"attn_norm.weight")
	group, D := int64(cfg.Heads/cfg.KVHeads), int64(cfg.HeadDim)
	for s := range c.Units {
		mark := len(g.Nodes)
		proj := func(name string, r0, heads int64) *core.Tensor {
			t := g.Named(shardName(name, s)).MatMul(h, rows(m, g, p+name+".weight", r0*D, heads*D))
			if cfg.QKVBias {
				t = g.Add(t, rows(m, g, p+name+".bias", r0*D, heads*D))
			}
			return g.Reshape(t, 1, heads, D)
		}
		q := arch.Rope(g, &m.Config, shardName("q_rope", s), proj("attn_q", c.KV0[s]*group, c.NKV[s]*group), pos, l)
		k := arch.Rope(g, &m.Config, shardName("k_rope", s), proj("attn_k", c.KV0[s], c.NKV[s]), pos, l)
		v := proj("attn_v", c.KV0[s], c.NKV[s])
		qs, ks, vs = append(qs, q), append(ks, arch.ConvertKV(g, k, kv.K)), append(vs, arch.ConvertKV(g, v, kv.V))
		st.own(mark, s, c.Units)
	}
	return qs, ks, vs
}

// Stage builds the sharded embedding stage (s 0: outputs x, then each shard's q, k, v) or
// layer s-1's stage (llm.StageHook): inputs x, each shard's q ("q.shard<s>"), the caches and
// the query offset (and the next layer's positions); outputs x, then each shard's q, k, v of
// the next layer (or the logits after the last).
func (c *cutHook) Stage(cs *llm.Seam, s int) (llm.HookStage, error) {
	st := &stage{llm.HookStage{Graph: core.NewGraph(), Units: map[int]int{}}}
	if len(c.Units) > 1 {
		st.SharedUnits = [2]int{c.Units[0], c.Units[1]}
	}
	var err error
	if s == 0 {
		err = c.embedStage(st, cs.KVTypes())
	} else {
		err = c.layerStage(st, s-1, cs.Capacity(), cs.KVTypes())
	}
	return st.HookStage, err
}

func (c *cutHook) embedStage(st *stage, kv kvcache.Types) error {
	g, m := st.Graph, c.m
	ids := g.Input("ids", core.I32, 1)
	pos := arch.PosInputs(g, &m.Config, 1)
	x := m.Block(g).Embed(ids)
	g.SetNamePrefix("blk.0.")
	qs, ks, vs := c.qkv(st, x, pos, 0, kv)
	g.Output(x)
	for s := range qs {
		g.Output(qs[s], ks[s], vs[s])
	}
	if err := g.Err(); err != nil {
		return fmt.Errorf("llm: building the sharded embedding stage: %w", err)
	}
	return nil
}

func (c *cutHook) layerStage(st *stage, l int, capacity int64, kv kvcache.Types) error {
	g, m, cfg := st.Graph, c.m, c.m.Config
	g.SetNamePrefix(fmt.Sprintf("blk.%d.", l))
	group, D := int64(cfg.Heads/cfg.KVHeads), int64(cfg.HeadDim)
	x := g.Input("x", core.F32, 1, int64(cfg.Dim))
	var qs []*core.Tensor
	for s := range c.Units {
		qs = append(qs, g.Input(shardName("q", s), core.F32, 1, c.NKV[s]*group, D))
	}
	kc := g.Input("k_cache", kv.K, capacity, int64(cfg.KVHeads), D)
	vc := g.Input("v_cache", kv.V, capacity, int64(cfg.KVHeads), D)
	qoff := g.Input("q_offset", core.I32, 1)
	p := fmt.Sprintf("blk.%d.", l)
	scale := float32(1 / math.Sqrt(float64(D)))
	var parts []*core.Tensor
	for s := range c.Units {
		mark := len(g.Nodes)
		nq := c.NKV[s] * group
		a := g.Named(shardName("attn", s)).Attention(qs[s], kc, vc, core.AttentionOptions{Scale: scale, Causal: true,
			QOffsetInput: qoff, KVHeadOffset: c.KV0[s], KVHeads: c.NKV[s]})
		a = g.Reshape(a, 1, nq*D)
		parts = append(parts, g.Named(shardName("attn_output", s)).MatMul(a, m.Columns(g, p+"attn_output.weight", c.KV0[s]*group*D, nq*D)))
		st.own(mark, s, c.Units)
	}
	x = sumInto(g, "attn_residual", x, parts)

	h := m.Block(g).Norm(x, p+"ffn_norm.weight")
	parts = parts[:0]
	for _, pc := range c.Shared {
		mark := len(g.Nodes)
		parts = append(parts, c.ffnPiece(g, h, p, "ffn_piece", pc))
		st.sharedPiece(mark)
	}
	for s := range c.Units {
		if c.Shared != nil {
			break
		}
		mark := len(g.Nodes)
		for _, pc := range c.FFN[s] {
			parts = append(parts, c.ffnPiece(g, h, p, shardName("ffn", s), pc))
		}
		st.own(mark, s, c.Units)
	}
	// in neuron order, whichever unit ran a piece: every cut of adaptive shards gives the
	// same sums, so the output does not depend on how the units' speeds moved the cut
	x = sumInto(g, "ffn_residual", x, parts)

	if l+1 < cfg.Layers {
		pos := arch.PosInputs(g, &m.Config, 1)
		g.SetNamePrefix(fmt.Sprintf("blk.%d.", l+1))
		qs, ks, vs := c.qkv(st, x, pos, l+1, kv)
		g.Output(x)
		for s := range qs {
			g.Output(qs[s], ks[s], vs[s])
		}
	} else {
		g.Output(m.Block(g).Logits(x))
	}
	if err := g.Err(); err != nil {
		return fmt.Errorf("llm: building sharded layer %d: %w", l, err)
	}
	return nil
}

// ffnPiece is the FFN of neurons [pc[0], pc[0]+pc[1]) of h, layer prefix p: a partial sum of
// the down projection. Its nodes are named name.gate, .up, .act, .down.
func (c *cutHook) ffnPiece(g *core.Graph, h *core.Tensor, p, name string, pc [2]int64) *core.Tensor {
	m := c.m
	f0, nf := pc[0], pc[1]
	gate := g.Named(name+".gate").MatMul(h, rows(m, g, p+"ffn_gate.weight", f0, nf))
	up := g.Named(name+".up").MatMul(h, rows(m, g, p+"ffn_up.weight", f0, nf))
	f := g.Named(name+".act").Mul(arch.Activate(g, m.Config.Activation, gate), up)
	return g.Named(name+".down").MatMul(f, m.Columns(g, p+"ffn_down.weight", f0, nf))
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

// Bind binds each shard's slice of q read (qIn, the lanes of the q the stage reads) as
// "q.shard<s>" and returns, but after the last layer, per shard its slice of q written (qOut)
// and its heads of layer s's K and V cache rows (strided by the row, as the unsharded K and V
// outputs), written in place (llm.StageHook).
func (c *cutHook) Bind(cs *llm.Seam, s int, qIn, qOut []sched.Span, byName map[string]sched.Binding) ([]sched.Binding, error) {
	cfg := c.m.Config
	group, D := int64(cfg.Heads/cfg.KVHeads), int64(cfg.HeadDim)
	kvt := cs.KVTypes()
	headBytes := [2]int64{kvt.K.Bytes(D), kvt.V.Bytes(D)}
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
	var out []sched.Binding
	for sh := range c.Units {
		qOff, qSize := c.KV0[sh]*group*D*4, c.NKV[sh]*group*D*4
		in, err := lanes(qIn, qOff, qSize)
		if err != nil {
			return nil, err
		}
		byName[shardName("q", sh)] = sched.Binding{Lanes: in}
		if s >= cfg.Layers {
			continue
		}
		qo, err := lanes(qOut, qOff, qSize)
		if err != nil {
			return nil, err
		}
		out = append(out, sched.Binding{Lanes: qo})
		k, v := cs.KV(s, false)
		for i, b := range []sched.Binding{k, v} {
			off := c.KV0[sh] * headBytes[i]
			span, err := b.Span.Slice(off, b.Span.Size-off)
			if err != nil {
				return nil, fmt.Errorf("llm: shard bindings: %w", err)
			}
			out = append(out, sched.Binding{Span: span, Stride: int64(cfg.KVHeads) * headBytes[i]})
		}
	}
	return out, nil
}

// decode is a runner's decode shards (llm.ShardedDecode). With adaptive shards
// (PlanShards.Adapt) it moves the cut: after each decode step it compares the two units' busy
// times and, when one has been busier by more than moving a piece of neurons would shift, runs
// the next steps with the cut one piece over.
type decode struct {
	cuts  []*cutHook
	cur   int
	diff  float64 // moving average of unit 0's busy time less unit 1's per step, in seconds
	since int     // steps since the cut last moved
	moves int
}

// Hooks are the cuts' stage hooks, unit 0's neurons rising.
func (a *decode) Hooks() []llm.StageHook {
	out := make([]llm.StageHook, len(a.cuts))
	for i, c := range a.cuts {
		out[i] = c
	}
	return out
}

// Current is the cut the next decode step runs.
func (a *decode) Current() int { return a.cur }

// adaptSettle is how many steps the cut stays before it may move again: the average must
// first see the new cut's times.
const adaptSettle = 4

// Observe takes the decode step that just ran and picks the cut for the next one.
func (a *decode) Observe(busy []time.Duration, log *slog.Logger) {
	if len(a.cuts) < 2 || len(a.cuts[0].Units) < 2 {
		return
	}
	u0, u1 := a.cuts[0].Units[0], a.cuts[0].Units[1]
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
	// a piece is AdaptStep of the neurons; the FFN is most of a layer's weights, so moving it
	// shifts about that share of the two units' busy time from one to the other
	shift := AdaptStep * 0.8 * (b0 + b1)
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
		if log == nil {
			return
		}
		log.Debug("llm: adaptive shards moved their cut", "unit0_neurons", Neurons(a.cuts[next].FFN[0]),
			"busy0", b0, "busy1", b1, "moves", a.moves)
	}
}
