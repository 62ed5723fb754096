package arch

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// The model is cut into Layers+1 stage graphs per chunk length C (mllm-NPU's chunk-sharing
// graphs). Every shape depends only on C and the cache capacity, never on the position: RoPE
// takes positions as an input and ATTENTION its query offset, so one prepared graph serves every
// chunk of every prompt.
//
//	stage 0:    ids, pos → embedding → x and layer 0's q, k, v
//	stage l+1:  x, q, K cache, V cache, q_offset [, pos] → attention and FFN of layer l → x and
//	            layer l+1's q, k, v (or, after the last layer, the logits)
//
// K and V are stage outputs bound into the cache buffers at the chunk's row: the cache is
// appended without a copy, and since the next stage runs after this one, its attention sees the
// rows just written. A padded last chunk writes its padding rows past the last real token,
// where the causal mask hides them until real tokens overwrite them. Inputs are named as the
// runner binds them: ids, pos (or rope_cos and rope_sin), x, q, k_cache, v_cache, q_offset and
// a tree's mask; the outputs, in order, are x, q, k, v (k and v of the next layer, in the cache's
// dtypes), or the logits after the last layer.

// Stage is the shape of a model's stage graphs for one chunk length over one KV cache.
type Stage struct {
	// C is the chunk length: the token rows a stage takes.
	C int64
	// Capacity is the cache's rows, which a chunk's attention reads (masked).
	Capacity int64
	// K and V are the cache's dtypes, which a stage converts the rows it appends to.
	K, V core.DType
	// Tree gives attention an i8 [C, C] "mask" input: who sees whom among the chunk's tokens, a
	// draft tree verified in one pass (the positions are then the caller's too: a tree's depth,
	// not its row).
	Tree bool
	// Hidden ends the last stage with the final-normed hidden state instead of the logits (what
	// an embedding pools).
	Hidden bool
}

// StageName is how errors name stage s of a model of layers layers: stage 0 embeds, stage l+1
// finishes layer l.
func StageName(s, layers int) string {
	switch {
	case s == 0:
		return "stage 0 (embedding, layer 0's q/k/v)"
	case s == layers:
		return fmt.Sprintf("stage %d (layer %d, output head)", s, s-1)
	}
	return fmt.Sprintf("stage %d (layer %d)", s, s-1)
}

// OutputRole names output i of stage graph g: x, q, k or v (a stage's outputs in order), the
// logits of a stage with one output, or for an output past them (one a technique adds) its
// index.
func OutputRole(g *core.Graph, i int) string {
	if len(g.Outputs) == 1 {
		return "logits"
	}
	if roles := [...]string{"x", "q", "k", "v"}; i < len(roles) {
		return roles[i]
	}
	return fmt.Sprint(i)
}

// Embed builds stage 0 into b's graph: ids and positions in, the embedding x and layer 0's q,
// k, v out.
func (st Stage) Embed(b Block) error {
	g := b.g
	ids := g.Input("ids", core.I32, st.C)
	pos := PosInputs(g, b.c, st.C)
	x := b.Embed(ids)
	q, k, v := b.QKV(x, pos, 0)
	g.Output(x, q, ConvertKV(g, k, st.K), ConvertKV(g, v, st.V))
	if err := g.Err(); err != nil {
		return fmt.Errorf("arch: building the embedding stage: %w", err)
	}
	return nil
}

// Layer builds the stage that finishes layer l into b's graph: its inputs (LayerInputs, and a
// tree's mask), attention over the cache, the rest of the layer, then Next.
func (st Stage) Layer(b Block, l int) error {
	g, c := b.g, b.c
	g.SetNamePrefix(LayerName(l, ""))
	in := st.LayerInputs(g, c)
	var mask *core.Tensor
	if st.Tree {
		mask = g.Input("mask", core.I8, st.C, st.C)
	}
	opts := c.AttentionOptions(l, st.Capacity)
	opts.Causal, opts.QOffsetInput, opts.Mask = true, in.QOffset, mask
	if st.Tree && opts.Window > 0 {
		// ATTENTION's window and its tree mask do not combine
		return fmt.Errorf("arch: layer %d: a draft tree over a sliding window of %d (context above it): %w",
			l, opts.Window, core.ErrUnsupported)
	}
	a := g.Named("attn").Attention(in.Q, in.KCache, in.VCache, opts)
	// inner nodes first: Named names the next node added (plan rules match these names)
	x := b.Finish(in.X, g.Reshape(a, st.C, int64(c.Heads*c.HeadDim)), l)
	st.Next(b, x, l)
	if err := g.Err(); err != nil {
		return fmt.Errorf("arch: building layer %d: %w", l, err)
	}
	return nil
}

// Next ends a stage whose layer l gave x [C, dim]: x and layer l+1's q, k, v as its outputs
// (with the positions as inputs), or after the last layer the logits (the hidden state with
// Hidden).
func (st Stage) Next(b Block, x *core.Tensor, l int) {
	g := b.g
	if l+1 < b.c.Layers {
		pos := PosInputs(g, b.c, st.C)
		g.SetNamePrefix(LayerName(l+1, ""))
		q, k, v := b.QKV(x, pos, l+1)
		g.Output(x, q, ConvertKV(g, k, st.K), ConvertKV(g, v, st.V))
		return
	}
	if !st.Hidden {
		g.Output(b.Logits(x))
		return
	}
	g.SetNamePrefix("")
	g.Output(b.Norm(x, "output_norm.weight"))
}

// LayerInputs are the inputs of a stage that finishes a layer, named as the runner binds them.
type LayerInputs struct {
	X, Q, KCache, VCache, QOffset *core.Tensor
}

// LayerInputs adds to g the inputs of a stage that finishes a layer of the model of config c:
// the residual x [C, dim], the rotated queries q [C, H, D], the K and V cache [Capacity, Hkv, D]
// and the chunk's query offset.
func (st Stage) LayerInputs(g *core.Graph, c *Config) LayerInputs {
	H, Hkv, D := int64(c.Heads), int64(c.KVHeads), int64(c.HeadDim)
	return LayerInputs{
		X:       g.Input("x", core.F32, st.C, int64(c.Dim)),
		Q:       g.Input("q", core.F32, st.C, H, D),
		KCache:  g.Input("k_cache", st.K, st.Capacity, Hkv, D),
		VCache:  g.Input("v_cache", st.V, st.Capacity, Hkv, D),
		QOffset: g.Input("q_offset", core.I32, 1),
	}
}

// ConvertKV converts new K or V rows [C, Hkv, D] to the cache's dtype dt: a CAST to F16, or
// QUANTIZE to blocks along the head dimension.
func ConvertKV(g *core.Graph, t *core.Tensor, dt core.DType) *core.Tensor {
	switch dt {
	case core.F32:
		return t
	case core.Q8_0, core.Q4_0:
		return g.Quantize(t, dt, 0)
	}
	return g.Cast(t, dt)
}
