package batch

// A Batch's caches and graphs: each slot's rows of the batch's K and V caches, and the batched
// decode step's stage graphs (per-sequence attention, the decoding rows' logits, a prompt chunk
// riding in the step), built from the model's blocks.

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/sched"
)

// slot is a runner of a Batch: its sequence hook, whose cache is slot i of the batch's.
type slot struct {
	b    *Batch
	i    int
	seam *llm.Seam
	// short is the runner's programs of the batch's short chunk (InterleaveChunk), nil without.
	short *llm.Program
}

// Attach gives the runner slot i of the batch's caches; the first runner to attach on a runtime
// allocates them, and the position inputs of the steps, in that runtime's arena.
func (s *slot) Attach(seam *llm.Seam) ([][2]sched.Span, error) {
	s.seam = seam
	b, r := s.b, seam.Runner()
	capacity := seam.Capacity()
	var rowBytes [2]int64
	rowBytes[0], rowBytes[1] = seam.KVTypes().RowBytes(r.Model().Config)
	if b.rt != r.Runtime() {
		if err := b.alloc(r, capacity, rowBytes); err != nil {
			return nil, err
		}
	}
	if capacity != b.cap || rowBytes != b.rowBytes {
		return nil, fmt.Errorf("batch: slot of %d rows of %v bytes (K, V), runner wants %d of %v: %w",
			b.cap, b.rowBytes, capacity, rowBytes, core.ErrInternal)
	}
	out := make([][2]sched.Span, len(b.kv))
	for l, kv := range b.kv {
		for j := range kv {
			size := capacity * rowBytes[j]
			sp, err := kv[j].Slice(int64(s.i)*size, size)
			if err != nil {
				return nil, fmt.Errorf("batch: slot %d: %w", s.i, err)
			}
			out[l][j] = sp
		}
	}
	return out, nil
}

// feed runs tokens through the runner's programs of chunk length c: the short chunk's, or the
// runner's own (1, its prefill chunk).
func (s *slot) feed(ctx context.Context, tokens []int32, c int) ([]float32, error) {
	p := s.short
	if p == nil || c != p.Len() {
		var err error
		if p, err = s.seam.Program(c); err != nil {
			return nil, err
		}
	}
	return p.Run(ctx, tokens, nil, nil, nil)
}

// Prefill serves the runner's Prefill through the batch.
func (s *slot) Prefill(ctx context.Context, tokens []int32) ([]float32, error) {
	return s.b.prefill(ctx, s, tokens)
}

// Decode serves the runner's Decode through the batch.
func (s *slot) Decode(ctx context.Context, token int32) ([]float32, error) {
	return s.b.decode(ctx, s, token)
}

// alloc allocates in r's runtime the caches of every slot, capacity rows of rowBytes each, and
// the inputs of a step's rows: n decoding sequences, or fewer and a prompt chunk (at most the
// runners' chunk).
func (b *Batch) alloc(r *llm.Runner, capacity int64, rowBytes [2]int64) error {
	n, c := int64(len(b.seen)), b.m.Config
	b.rt, b.cap, b.rowBytes, b.kv = r.Runtime(), capacity, rowBytes, nil
	al := b.rt.Arena().Allocs()
	alloc := al.Alloc
	for range c.Layers {
		b.kv = append(b.kv, [2]sched.Span{alloc(n * capacity * rowBytes[0]), alloc(n * capacity * rowBytes[1])})
	}
	rows := n + int64(r.ChunkSize())
	b.ids, b.pos, b.qoff, b.outRows = alloc(4*rows), alloc(4*rows), alloc(4*n), alloc(4*n)
	if f := c.RopeFreqFactors; f != nil {
		b.cos, b.sin = alloc(rows*int64(len(f)*4)), alloc(rows*int64(len(f)*4))
	}
	if al.Err != nil {
		return fmt.Errorf("batch of %d: caches: %w", n, al.Err)
	}
	return nil
}

// compile prepares the batched decode program of n sequences over c rows: the stage graphs of
// chunk length c with a cache, a query offset and K/V outputs per sequence (stageGraph), every
// binding of a sequence moved by its own row slot. Every sequence has one row but the last,
// which has the rest: c = n for a decode step, more when the last is a prompt chunk.
func (b *Batch) compile(ctx context.Context, n, c int) (*batchProg, error) {
	cfg := b.m.Config
	a := b.rt.Arena()
	name := fmt.Sprintf("decode (batch %d)", n)
	if c > n {
		name = fmt.Sprintf("decode (batch %d and a prompt chunk of %d)", n-1, c-n+1)
	}
	spec := sched.ProgramSpec{Name: name, Phase: sched.PhaseDecode, Lanes: 1}
	var x, q [2]sched.Span
	var logits sched.Span
	al := a.Allocs()
	for i := range 2 {
		x[i], q[i] = al.Alloc(int64(c*cfg.Dim*4)), al.Alloc(int64(c*cfg.Heads*cfg.HeadDim*4))
	}
	logits = al.Alloc(int64(n * cfg.Vocab * 4)) // one row per sequence (outRows)
	err := al.Err
	if err != nil {
		return nil, fmt.Errorf("batch: activations of a batch of %d: %w", n, err)
	}
	qoff := make([]sched.Span, n)
	for i := range qoff {
		if qoff[i], err = b.qoff.Slice(int64(4*i), 4); err != nil {
			return nil, fmt.Errorf("batch of %d: %w", n, err)
		}
	}
	cacheOf := func(l int, name string) (sched.Binding, bool) {
		base, idx := name, 0
		if i := strings.LastIndexByte(name, '.'); i > 0 {
			v, err := strconv.Atoi(name[i+1:])
			if err != nil || v < 1 || v >= n {
				return sched.Binding{}, false
			}
			base, idx = name[:i], v
		}
		switch base {
		case "k_cache":
			return sched.Binding{Span: b.kv[l][0], Stride: b.rowBytes[0], RowSlot: 2*idx + 1}, true
		case "v_cache":
			return sched.Binding{Span: b.kv[l][1], Stride: b.rowBytes[1], RowSlot: 2*idx + 1}, true
		case "q_offset":
			return sched.Binding{Span: qoff[idx]}, true
		}
		return sched.Binding{}, false
	}
	for s := 0; s <= cfg.Layers; s++ {
		g, err := b.stageGraph(s, n, int64(c))
		if err != nil {
			return nil, err
		}
		in, out := (s+1)%2, s%2
		byName := map[string]sched.Binding{"ids": {Span: b.ids}, "pos": {Span: b.pos}, "rope_cos": {Span: b.cos},
			"rope_sin": {Span: b.sin}, "x": {Span: x[in]}, "q": {Span: q[in]}, "out_rows": {Span: b.outRows}}
		st := sched.StageSpec{Name: fmt.Sprintf("stage %d", s), Layer: max(s-1, 0), Graph: g,
			Units: make([]int, len(g.Nodes)), Fallback: make([]int, len(g.Nodes))}
		for i := range st.Fallback {
			st.Fallback[i] = -1
		}
		if s == 0 {
			st.Name = "embed"
		}
		for _, t := range g.Inputs {
			bd, ok := byName[t.Name]
			if !ok && s > 0 {
				bd, ok = cacheOf(s-1, t.Name)
			}
			if !ok {
				return nil, fmt.Errorf("batch: no binding for batched stage input %q: %w", t.Name, core.ErrInternal)
			}
			st.IO = append(st.IO, bd)
		}
		if s < cfg.Layers {
			// x, q, then each sequence's K and V row, written into its cache at its position
			st.IO = append(st.IO, sched.Binding{Span: x[out]}, sched.Binding{Span: q[out]})
			for i := range n {
				st.IO = append(st.IO, sched.Binding{Span: b.kv[s][0], Stride: b.rowBytes[0], RowSlot: 2*i + 2},
					sched.Binding{Span: b.kv[s][1], Stride: b.rowBytes[1], RowSlot: 2*i + 2})
			}
		} else {
			st.IO = append(st.IO, sched.Binding{Span: logits})
		}
		spec.Stages = append(spec.Stages, st)
	}
	po := b.slots[0].seam.PhaseOptions(sched.PhaseDecode)
	if len(po) > 0 && b.rt.Units()[0].Device().Info().Kind == core.DeviceCPU {
		spec.PrepareOptions = map[int]map[string]string{0: po}
	}
	prog, err := b.rt.Compile(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("batch: %s: %w", spec.Name, err)
	}
	return &batchProg{prog: prog, logits: logits}, nil
}

// stageGraph builds stage s (0: the embedding; l+1: the rest of layer l) of a step of n
// sequences over c rows, as the runner's stage graphs are built but with each sequence's
// attention over its own cache and its K and V rows as outputs of their own.
func (b *Batch) stageGraph(s, n int, c int64) (*core.Graph, error) {
	cfg := b.m.Config
	st := arch.Stage{C: c, Capacity: b.cap}
	st.K, st.V = b.runners[0].KVCacheTypes()
	g := core.NewGraph()
	blk := b.m.Block(g)
	if s == 0 {
		ids := g.Input("ids", core.I32, c)
		pos := arch.PosInputs(g, &cfg, c)
		x := blk.Embed(ids)
		q, k, v := blk.QKV(x, pos, 0)
		outputQKV(g, n, x, q, arch.ConvertKV(g, k, st.K), arch.ConvertKV(g, v, st.V))
		if err := g.Err(); err != nil {
			return nil, fmt.Errorf("batch: building the embedding stage: %w", err)
		}
		return g, nil
	}
	l := s - 1
	g.SetNamePrefix(fmt.Sprintf("blk.%d.", l))
	in := st.LayerInputs(g, &cfg)
	opts := cfg.AttentionOptions(l, b.cap)
	opts.Causal, opts.QOffsetInput = true, in.QOffset
	a := attention(g, n, in.Q, in.KCache, in.VCache, opts)
	// inner nodes first: Named names the next node added
	x := blk.Finish(in.X, g.Reshape(a, c, int64(cfg.Heads*cfg.HeadDim)), l)
	if l+1 < cfg.Layers {
		pos := arch.PosInputs(g, &cfg, c)
		g.SetNamePrefix(fmt.Sprintf("blk.%d.", l+1))
		nq, nk, nv := blk.QKV(x, pos, l+1)
		outputQKV(g, n, x, nq, arch.ConvertKV(g, nk, st.K), arch.ConvertKV(g, nv, st.V))
	} else {
		g.Output(blk.Logits(outRows(g, n, x)))
	}
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("batch: building layer %d: %w", l, err)
	}
	return g, nil
}

// attention is layer attention for a step of n sequences: each sequence's query rows over its
// own cache inputs (the first sequence's are kc, vc and o's query offset; the others' are inputs
// named with the sequence's index), concatenated back into [C, H, D].
func attention(g *core.Graph, n int, q, kc, vc *core.Tensor, o core.AttentionOptions) *core.Tensor {
	if q == nil || kc == nil || vc == nil {
		return nil // the graph has recorded its error
	}
	outs := make([]*core.Tensor, n)
	for i := range n {
		k, v, oi := kc, vc, o
		if i > 0 {
			k = g.Input("k_cache."+strconv.Itoa(i), kc.DType, kc.Shape...)
			v = g.Input("v_cache."+strconv.Itoa(i), vc.DType, vc.Shape...)
			oi.QOffsetInput = g.Input("q_offset."+strconv.Itoa(i), core.I32, 1)
		}
		outs[i] = g.Named("attn").Attention(g.Slice(q, 0, int64(i), seqRows(n, q, i)), k, v, oi)
	}
	return g.Concat(0, outs...)
}

// seqRows is how many rows of x [C, ...] sequence i of a step of n has: one, but the last
// sequence has the rest (a prompt chunk riding in a decode step).
func seqRows(n int, x *core.Tensor, i int) int64 {
	if i < n-1 {
		return 1
	}
	return x.Shape[0] - int64(n-1)
}

// outRows are the rows of x [C, dim] whose logits a step of n sequences needs: every decoding
// sequence's row and a prompt chunk's last token's, picked by the "out_rows" input (a chunk's
// last token is not its last row when padding follows it).
func outRows(g *core.Graph, n int, x *core.Tensor) *core.Tensor {
	if x == nil || x.Shape[0] == int64(n) {
		return x
	}
	return g.GetRows(x, g.Input("out_rows", core.I32, int64(n)))
}

// outputQKV sets a stage's outputs: x, q, then each of the n sequences' K and V rows, bound at
// its own cache row.
func outputQKV(g *core.Graph, n int, x, q, k, v *core.Tensor) {
	if k == nil || v == nil {
		g.Output(x, q, k, v) // the graph records the error
		return
	}
	outs := []*core.Tensor{x, q}
	for i := range n {
		outs = append(outs, g.Slice(k, 0, int64(i), seqRows(n, k, i)), g.Slice(v, 0, int64(i), seqRows(n, v, i)))
	}
	g.Output(outs...)
}
