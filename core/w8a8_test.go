package core

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func f32Bytes(xs ...float32) []byte {
	b := make([]byte, 0, 4*len(xs))
	for _, x := range xs {
		u := math.Float32bits(x)
		b = append(b, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
	}
	return b
}

func i32Bytes(xs ...int32) []byte {
	b := make([]byte, 0, 4*len(xs))
	for _, x := range xs {
		u := uint32(x)
		b = append(b, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
	}
	return b
}

func TestW8A8Infer(t *testing.T) {
	runInferCases(t, []inferCase{
		{"per-tensor gemm", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", I8, 3, 40), g.Input("b", I8, 5, 40), W8A8Options{AScale: 0.1, BScale: 0.2})
		}, F32, Shape{3, 5}},
		{"rank-1 gemv f16 out", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", I8, 40), g.Input("b", I8, 5, 40), W8A8Options{AScale: 0.1, BScale: 0.2, Out: F16})
		}, F16, Shape{5}},
		{"per-channel with grid", func(g *Graph) *Tensor {
			s := g.Const("s", F32, Shape{2}, f32Bytes(0.5, 0.25))
			return g.MatMulW8A8(g.Input("a", I8, 4, 8), g.Input("b", I8, 2, 8), W8A8Options{AScale: 1, BScales: s, OutScale: 0.01})
		}, F32, Shape{4, 2}},
		{"batched i8 a", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", I8, 2, 3, 8), g.Input("b", I8, 4, 8), W8A8Options{AScale: 1, BScale: 1})
		}, F32, Shape{2, 3, 4}},
		{"float a, per-channel i8 b", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", F16, 3, 8), g.Input("b", I8, 4, 8), W8A8Options{BScales: g.Input("s", F32, 4)})
		}, F16, Shape{3, 4}},
		{"shadow", func(g *Graph) *Tensor {
			return g.ShadowMatMul(g.Input("x", F32, 3, 10), g.Input("wt", F16, 4, 6), g.Input("ids", I32, 4), 2)
		}, F32, Shape{3, 6}},
		{"shadow rank 1, no ids", func(g *Graph) *Tensor {
			return g.ShadowMatMul(g.Input("x", F16, 10), g.Input("wt", F32, 10, 6), nil, 2)
		}, F16, Shape{6}},
		{"shadow inf threshold", func(g *Graph) *Tensor {
			return g.ShadowMatMul(g.Input("x", F32, 1, 10), g.Input("wt", F32, 10, 6), nil, float32(math.Inf(1)))
		}, F32, Shape{1, 6}},
	}, func(t *testing.T, g *Graph) {
		assert.EqualValues(t, 3, g.Opset())
	})
}

func TestW8A8BuildErrors(t *testing.T) {
	tests := []struct {
		name  string
		build func(g *Graph) *Tensor
		want  string
	}{
		{"i8 a float b", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", I8, 3, 8), g.Input("b", F32, 5, 8), W8A8Options{AScale: 1})
		}, "needs an i8 b"},
		{"no a scale", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", I8, 3, 8), g.Input("b", I8, 5, 8), W8A8Options{BScale: 1})
		}, "fattr[1]"},
		{"nan a scale", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", I8, 3, 8), g.Input("b", I8, 5, 8), W8A8Options{AScale: float32(math.NaN()), BScale: 1})
		}, "fattr[1]"},
		{"no b scale", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", I8, 3, 8), g.Input("b", I8, 5, 8), W8A8Options{AScale: 1})
		}, "fattr[0]"},
		{"both b scales", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", I8, 3, 8), g.Input("b", I8, 5, 8), W8A8Options{AScale: 1, BScale: 1, BScales: g.Input("s", F32, 5)})
		}, "must be 0"},
		{"scales wrong length", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", I8, 3, 8), g.Input("b", I8, 5, 8), W8A8Options{AScale: 1, BScales: g.Input("s", F32, 4)})
		}, "f32 [N]"},
		{"scales wrong dtype", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", I8, 3, 8), g.Input("b", I8, 5, 8), W8A8Options{AScale: 1, BScales: g.Input("s", F16, 5)})
		}, "f32 [N]"},
		{"zero const scale", func(g *Graph) *Tensor {
			s := g.Const("s", F32, Shape{2}, f32Bytes(1, 0))
			return g.MatMulW8A8(g.Input("a", I8, 3, 8), g.Input("b", I8, 2, 8), W8A8Options{AScale: 1, BScales: s})
		}, "scale 1 is 0"},
		{"scales with q8_0 b", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", F32, 3, 32), g.Input("b", Q8_0, 5, 32), W8A8Options{BScales: g.Input("s", F32, 5)})
		}, "need an i8 b"},
		{"grid with float a", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", F32, 3, 8), g.Input("b", I8, 5, 8), W8A8Options{BScale: 1, OutScale: 1})
		}, "need an i8 a"},
		{"negative grid", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", I8, 3, 8), g.Input("b", I8, 5, 8), W8A8Options{AScale: 1, BScale: 1, OutScale: -1})
		}, "fattr[2]"},
		{"bf16 out", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", I8, 3, 8), g.Input("b", I8, 5, 8), W8A8Options{AScale: 1, BScale: 1, Out: BF16})
		}, "f32 or f16 output"},
		{"K too large", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", I8, 1<<17), g.Input("b", I8, 1, 1<<17), W8A8Options{AScale: 1, BScale: 1})
		}, "2^17"},
		{"rank-0 i8 a", func(g *Graph) *Tensor {
			return g.MatMulW8A8(g.Input("a", I8), g.Input("b", I8, 5, 8), W8A8Options{AScale: 1, BScale: 1})
		}, "rank >= 1"},
		{"i8 a with q8_0 b", func(g *Graph) *Tensor {
			return g.MatMul(g.Input("a", I8, 3, 32), g.Input("b", Q8_0, 5, 32))
		}, "needs an i8 b"},
		{"shadow rank 3 x", func(g *Graph) *Tensor {
			return g.ShadowMatMul(g.Input("x", F32, 2, 3, 10), g.Input("wt", F32, 10, 6), nil, 1)
		}, "x must be"},
		{"shadow i8 wt", func(g *Graph) *Tensor {
			return g.ShadowMatMul(g.Input("x", F32, 3, 10), g.Input("wt", I8, 10, 6), nil, 1)
		}, "wt must be"},
		{"shadow C != K without ids", func(g *Graph) *Tensor {
			return g.ShadowMatMul(g.Input("x", F32, 3, 10), g.Input("wt", F32, 9, 6), nil, 1)
		}, "one row per input channel"},
		{"shadow ids length", func(g *Graph) *Tensor {
			return g.ShadowMatMul(g.Input("x", F32, 3, 10), g.Input("wt", F32, 4, 6), g.Input("ids", I32, 5), 1)
		}, "ids must be i32 [4]"},
		{"shadow const id out of range", func(g *Graph) *Tensor {
			ids := g.Const("ids", I32, Shape{2}, i32Bytes(3, 10))
			return g.ShadowMatMul(g.Input("x", F32, 3, 10), g.Input("wt", F32, 2, 6), ids, 1)
		}, "ids[1] = 10"},
		{"shadow zero threshold", func(g *Graph) *Tensor {
			return g.ShadowMatMul(g.Input("x", F32, 3, 10), g.Input("wt", F32, 10, 6), nil, 0)
		}, "threshold"},
		{"shadow nan threshold", func(g *Graph) *Tensor {
			return g.ShadowMatMul(g.Input("x", F32, 3, 10), g.Input("wt", F32, 10, 6), nil, float32(math.NaN()))
		}, "threshold"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGraph()
			out := tc.build(g)
			assert.Nil(t, out)
			require.Error(t, g.Err())
			assert.ErrorIs(t, g.Err(), ErrGraph)
			assert.Contains(t, g.Err().Error(), tc.want)
		})
	}
}

// A float MATMUL keeps op set 1 and stays valid with the unused v3 slots 0.
func TestMatMulV1Unchanged(t *testing.T) {
	g := NewGraph()
	g.Output(g.MatMulI8(g.Input("a", F32, 2, 8), g.Input("b", I8, 3, 8), 0.5))
	require.NoError(t, g.Validate())
	assert.EqualValues(t, 1, g.Opset())
}

// FuzzW8A8Inference: any shapes, ranks and scales given to MatMulW8A8 and ShadowMatMul either
// fail to build with an error or give an output whose shape is bounded; nothing panics.
func FuzzW8A8Inference(f *testing.F) {
	f.Add([]byte{2, 2, 1, 0}, int64(3), int64(40), int64(5), float32(0.1), float32(0.2), float32(0))
	f.Add([]byte{0, 2, 0, 1}, int64(0), int64(0), int64(0), float32(-1), float32(0), float32(1))
	f.Add([]byte{1, 3, 1, 1}, int64(1<<17), int64(1<<40), int64(7), float32(1), float32(1), float32(1e-3))
	f.Fuzz(func(t *testing.T, ranks []byte, m, k, n int64, sa, sb, so float32) {
		if len(ranks) < 4 {
			return
		}
		dims := []int64{m, k, n, m}
		shape := func(r byte, last int64) []int64 {
			s := append([]int64(nil), dims[:int(r)%5]...)
			if len(s) > 0 {
				s[len(s)-1] = last
			}
			return s
		}
		g := NewGraph()
		a := g.Input("a", I8, shape(ranks[0], k)...)
		b := g.Input("b", I8, shape(ranks[1], k)...)
		o := W8A8Options{AScale: sa, BScale: sb, OutScale: so, Out: DType(ranks[2] % 4)}
		if ranks[3]%2 == 1 && b != nil && len(b.Shape) > 0 {
			o.BScales = g.Input("s", F32, b.Shape[0])
			o.BScale = 0
		}
		outs := []*Tensor{g.MatMulW8A8(a, b, o)}
		g2 := NewGraph()
		x := g2.Input("x", F32, shape(ranks[0], k)...)
		wt := g2.Input("wt", F16, shape(ranks[1], n)...)
		var ids *Tensor
		if ranks[3]%2 == 1 && wt != nil && len(wt.Shape) > 0 {
			ids = g2.Input("ids", I32, wt.Shape[0])
		}
		outs = append(outs, g2.ShadowMatMul(x, wt, ids, so))
		for _, out := range outs {
			if out == nil {
				continue
			}
			if n := out.Shape.NumElements(); n < 0 || n > MaxElements || len(out.Shape) > MaxRank {
				t.Fatalf("output %s accepted", out.Shape)
			}
		}
	})
}
