package llm

// A Batch's graphs and caches: each slot's rows of the batch's K and V caches, and the
// batched decode step's stage graphs (per-sequence attention, the decoding rows' logits, a
// prompt chunk riding in the step).

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// batchSlot gives a runner of a Batch its cache: slot i of the batch's.
type batchSlot struct {
	b *Batch
	i int
}

// cache is the slot's K and V per layer, rows of the batch's caches.
func (s *batchSlot) cache(rows int64, rowBytes [2]int64) ([][2]sched.Span, error) {
	if rows != s.b.cap || rowBytes != s.b.rowBytes {
		return nil, fmt.Errorf("llm: batch slot of %d rows of %v bytes (K, V), runner wants %d of %v: %w",
			s.b.cap, s.b.rowBytes, rows, rowBytes, core.ErrInternal)
	}
	out := make([][2]sched.Span, len(s.b.kv))
	for l, kv := range s.b.kv {
		for j := range kv {
			size := rows * rowBytes[j]
			sp, err := kv[j].Slice(int64(s.i)*size, size)
			if err != nil {
				return nil, fmt.Errorf("llm: batch slot %d: %w", s.i, err)
			}
			out[l][j] = sp
		}
	}
	return out, nil
}

// compile prepares the batched decode program of n sequences over c rows: the stage graphs of
// chunk length c with a cache, a query offset and K/V outputs per sequence (stageBuild.batch),
// every binding of a sequence moved by its own row slot. Every sequence has one row but the
// last, which has the rest: c = n for a decode step, more when the last is a prompt chunk.
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
	logits = al.Alloc(int64(n * cfg.Vocab * 4)) // one row per sequence (stageBuild.outRows)
	err := al.Err
	if err != nil {
		return nil, fmt.Errorf("llm: activations of a batch of %d: %w", n, err)
	}
	qoff := make([]sched.Span, n)
	for i := range qoff {
		if qoff[i], err = b.qoff.Slice(int64(4*i), 4); err != nil {
			return nil, fmt.Errorf("llm: batch of %d: %w", n, err)
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
		sb := &stageBuild{batch: n}
		var g *core.Graph
		if s == 0 {
			g, err = b.m.buildEmbedStage(int64(c), b.cfg.kv, sb)
		} else {
			g, err = b.m.buildLayerStage(s-1, int64(c), b.cap, b.cfg.kv, false, sb)
		}
		if err != nil {
			return nil, err
		}
		if s > 0 && batchedCaches(g) != n-1 {
			// a layer builder that calls ATTENTION itself, not through stageBuild.attention,
			// would attend every sequence's query over the first one's cache
			return nil, fmt.Errorf("llm: batch: layer %d's attention is not built per sequence: %w", s-1, core.ErrUnsupported)
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
				return nil, fmt.Errorf("llm: no binding for batched stage input %q: %w", t.Name, core.ErrInternal)
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
	if po := b.cfg.phaseOpts[sched.PhaseDecode]; len(po) > 0 && b.rt.Units()[0].Device().Info().Kind == core.DeviceCPU {
		spec.PrepareOptions = map[int]map[string]string{0: po}
	}
	prog, err := b.rt.Compile(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("llm: %s: %w", spec.Name, err)
	}
	return &batchProg{prog: prog, logits: logits}, nil
}

// batchedCaches counts the per-sequence K cache inputs of a batched layer stage (all but the
// first sequence's).
func batchedCaches(g *core.Graph) int {
	n := 0
	for _, t := range g.Inputs {
		if strings.HasPrefix(t.Name, "k_cache.") {
			n++
		}
	}
	return n
}

// attention is layer attention of q over the cache: for a batched step, each sequence's query
// rows over its own cache inputs (the first sequence's are kc, vc and o's query offset; the
// others' are inputs named with the sequence's index), concatenated back into [C, H, D]. Each
// sequence has one row but the last, which has the rest (seqRows).
func (sb *stageBuild) attention(g *core.Graph, q, kc, vc *core.Tensor, o core.AttentionOptions) *core.Tensor {
	if sb == nil || sb.batch <= 1 {
		return g.Named("attn").Attention(q, kc, vc, o)
	}
	if o.Mask != nil || q == nil || kc == nil || vc == nil {
		g.Named("attn").Attention(q, kc, vc, o) // the graph records the error
		return nil
	}
	outs := make([]*core.Tensor, sb.batch)
	for i := range sb.batch {
		k, v, oi := kc, vc, o
		if i > 0 {
			k = g.Input("k_cache."+strconv.Itoa(i), kc.DType, kc.Shape...)
			v = g.Input("v_cache."+strconv.Itoa(i), vc.DType, vc.Shape...)
			oi.QOffsetInput = g.Input("q_offset."+strconv.Itoa(i), core.I32, 1)
		}
		outs[i] = g.Named("attn").Attention(g.Slice(q, 0, int64(i), sb.seqRows(q, i)), k, v, oi)
	}
	return g.Concat(0, outs...)
}

// seqRows is how many rows of x [C, ...] sequence i of a batched step has: one, but the last
// sequence has the rest (a prompt chunk riding in a decode step).
func (sb *stageBuild) seqRows(x *core.Tensor, i int) int64 {
	if i < sb.batch-1 {
		return 1
	}
	return x.Shape[0] - int64(sb.batch-1)
}

// outRows are the rows of x [C, dim] whose logits a batched step needs: every decoding
// sequence's row and a prompt chunk's last token's, picked by the "out_rows" input (a chunk's
// last token is not its last row when padding follows it). Other stages keep every row.
func (sb *stageBuild) outRows(g *core.Graph, x *core.Tensor) *core.Tensor {
	if sb == nil || sb.batch <= 1 || x == nil || x.Shape[0] == int64(sb.batch) {
		return x
	}
	return g.GetRows(x, g.Input("out_rows", core.I32, int64(sb.batch)))
}

// outputQKV sets a stage's outputs x, q and the new K and V rows; a batched step's K and V are
// one output per sequence, each bound at its own cache row.
func (sb *stageBuild) outputQKV(g *core.Graph, x, q, k, v *core.Tensor) {
	if sb == nil || sb.batch <= 1 || k == nil || v == nil {
		g.Output(x, q, k, v)
		return
	}
	outs := []*core.Tensor{x, q}
	for i := range sb.batch {
		outs = append(outs, g.Slice(k, 0, int64(i), sb.seqRows(k, i)), g.Slice(v, 0, int64(i), sb.seqRows(v, i)))
	}
	g.Output(outs...)
}
