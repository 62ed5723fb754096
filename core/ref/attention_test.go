package ref

import (
	"testing"

	"github.com/xpuhub/xpu/core"
)

func TestAttention(t *testing.T) {
	// A KV cache of capacity 3 whose last row is garbage: it must never be read.
	k3 := []float32{0, 0, 0, 0, nan, nan}
	v3 := []float32{1, 2, 3, 6, nan, nan}
	runCases(t, []opCase{
		{name: "explicit scale", shape: core.Shape{1, 1, 2}, build: func(g *core.Graph) *core.Tensor {
			// scores [1, 0] -> weights [e/(e+1), 1/(e+1)]
			q := c32(g, core.Shape{1, 1, 2}, 1, 0)
			k := c32(g, core.Shape{2, 1, 2}, 1, 0, 0, 1)
			v := c32(g, core.Shape{2, 1, 2}, 1, 2, 3, 4)
			return g.Attention(q, k, v, core.AttentionOptions{Scale: 1})
		}, want: []float32{1.5378828427, 2.5378828427}},
		{name: "default scale 1/sqrt(D)", build: func(g *core.Graph) *core.Tensor {
			q := c32(g, core.Shape{1, 1, 4}, 2, 0, 0, 0)
			k := c32(g, core.Shape{2, 1, 4}, 1, 0, 0, 0, 0, 0, 0, 0)
			v := c32(g, core.Shape{2, 1, 2}, 1, 2, 3, 4)
			return g.Attention(q, k, v, core.AttentionOptions{})
		}, want: []float32{1.5378828427, 2.5378828427}},
		{name: "causal skips garbage rows", build: func(g *core.Graph) *core.Tensor {
			q := c32(g, core.Shape{2, 1, 2}, 0, 0, 0, 0)
			return g.Attention(q, c32(g, core.Shape{3, 1, 2}, k3...), c32(g, core.Shape{3, 1, 2}, v3...),
				core.AttentionOptions{Causal: true})
		}, want: []float32{1, 2, 2, 4}},
		{name: "causal q_offset attribute", build: func(g *core.Graph) *core.Tensor {
			q := c32(g, core.Shape{1, 1, 2}, 0, 0)
			return g.Attention(q, c32(g, core.Shape{3, 1, 2}, k3...), c32(g, core.Shape{3, 1, 2}, v3...),
				core.AttentionOptions{Causal: true, QOffset: 1})
		}, want: []float32{2, 4}},
		{name: "causal q_offset input overrides attribute", inputs: [][]byte{core.EncodeI32([]int32{1})},
			build: func(g *core.Graph) *core.Tensor {
				q := c32(g, core.Shape{1, 1, 2}, 0, 0)
				off := g.Input("q_offset", core.I32, 1)
				return g.Attention(q, c32(g, core.Shape{3, 1, 2}, k3...), c32(g, core.Shape{3, 1, 2}, v3...),
					core.AttentionOptions{Causal: true, QOffset: 0, QOffsetInput: off})
			}, want: []float32{2, 4}},
		{name: "no visible key gives 0", build: func(g *core.Graph) *core.Tensor {
			q := c32(g, core.Shape{2, 1, 2}, 1, 1, 1, 1)
			return g.Attention(q, c32(g, core.Shape{3, 1, 2}, k3...), c32(g, core.Shape{3, 1, 2}, v3...),
				core.AttentionOptions{Causal: true, QOffset: -1})
		}, want: []float32{0, 0, 1, 2}},
		{name: "gqa heads share kv heads", shape: core.Shape{1, 4, 1}, build: func(g *core.Graph) *core.Tensor {
			// heads 0,1 read kv head 0; heads 2,3 read kv head 1
			q := c32(g, core.Shape{1, 4, 1}, 1, 2, 3, 4)
			k := c32(g, core.Shape{1, 2, 1}, 5, 6)
			v := c32(g, core.Shape{1, 2, 1}, 10, 20)
			return g.Attention(q, k, v, core.AttentionOptions{})
		}, want: []float32{10, 10, 20, 20}},
		{name: "kv head range", shape: core.Shape{1, 2, 1}, build: func(g *core.Graph) *core.Tensor {
			// kv heads 1..2 of 3 (values 20, 30; head 0 and 3 would give 10 and 40); one query
			// head per kv head; head 0 of q reads kv head 1, head 1 kv head 2
			k := c32(g, core.Shape{1, 3, 1}, 0, 0, 0)
			v := c32(g, core.Shape{1, 3, 1}, 10, 20, 30)
			return g.Attention(c32(g, core.Shape{1, 2, 1}, 1, 1), k, v, core.AttentionOptions{KVHeadOffset: 1, KVHeads: 2})
		}, want: []float32{20, 30}},
		{name: "kv head range, grouped", shape: core.Shape{2, 2, 1}, build: func(g *core.Graph) *core.Tensor {
			// two query heads per kv head; the range is kv head 1 of 2; two keys, causal: row 0
			// sees key 0 (20), row 1 the average of keys 0 and 1 (scores 0)
			k := c32(g, core.Shape{2, 2, 1}, 0, 0, 0, 0)
			v := c32(g, core.Shape{2, 2, 1}, 10, 20, 30, 40)
			return g.Attention(c32(g, core.Shape{2, 2, 1}, 1, 1, 1, 1), k, v,
				core.AttentionOptions{Causal: true, KVHeadOffset: 1, KVHeads: 1})
		}, want: []float32{20, 20, 30, 30}},
		{name: "gqa with scores, Dv != D", shape: core.Shape{1, 2, 3}, build: func(g *core.Graph) *core.Tensor {
			// one kv head; head 0 scores [1, 0], head 1 scores [0, 1] (scale 1)
			q := c32(g, core.Shape{1, 2, 2}, 1, 0, 0, 1)
			k := c32(g, core.Shape{2, 1, 2}, 1, 0, 0, 1)
			v := c32(g, core.Shape{2, 1, 3}, 1, 0, 0, 0, 1, 0)
			return g.Attention(q, k, v, core.AttentionOptions{Scale: 1})
		}, want: []float32{0.7310585786, 0.2689414214, 0, 0.2689414214, 0.7310585786, 0}},
		{name: "f16 k and v with f32 q", build: func(g *core.Graph) *core.Tensor {
			q := c32(g, core.Shape{1, 1, 2}, 1, 0)
			k := c16(g, core.Shape{2, 1, 2}, 1, 0, 0, 1)
			v := c16(g, core.Shape{2, 1, 2}, 1, 2, 3, 4)
			return g.Attention(q, k, v, core.AttentionOptions{Scale: 1})
		}, want: []float32{1.5378828427, 2.5378828427}},
		{name: "f16 q gives f16", build: func(g *core.Graph) *core.Tensor {
			q := c16(g, core.Shape{1, 1, 2}, 0, 0)
			k := c32(g, core.Shape{2, 1, 2}, 1, 0, 0, 1)
			v := c32(g, core.Shape{2, 1, 2}, 1, 2, 3, 4)
			return g.Attention(q, k, v, core.AttentionOptions{})
		}, wantBytes: u16s(0x4000, 0x4200)}, // 2, 3
		{name: "zero queries", shape: core.Shape{0, 1, 2}, build: func(g *core.Graph) *core.Tensor {
			return g.Attention(c32(g, core.Shape{0, 1, 2}), c32(g, core.Shape{3, 1, 2}, k3...),
				c32(g, core.Shape{3, 1, 2}, v3...), core.AttentionOptions{Causal: true})
		}, want: []float32{}},
		{name: "zero keys", build: func(g *core.Graph) *core.Tensor {
			return g.Attention(c32(g, core.Shape{1, 1, 2}, 1, 1), c32(g, core.Shape{0, 1, 2}),
				c32(g, core.Shape{0, 1, 2}), core.AttentionOptions{})
		}, want: []float32{0, 0}},
	})
}
