package core

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// inferCase builds one node and gives the dtype and shape that inference must give it.
type inferCase struct {
	name  string
	build func(g *Graph) *Tensor
	dtype DType
	shape Shape
}

// runInferCases builds each case as the output of a graph of its own, checks the output's dtype
// and shape, validates the graph and then runs check, when not nil, on it.
func runInferCases(t *testing.T, tests []inferCase, check func(t *testing.T, g *Graph)) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGraph()
			out := tc.build(g)
			require.NoError(t, g.Err())
			assert.Equal(t, tc.dtype, out.DType)
			assert.Equal(t, tc.shape, out.Shape)
			g.Output(out)
			require.NoError(t, g.Validate())
			if check != nil {
				check(t, g)
			}
		})
	}
}

// graphErrorCase builds a graph that must fail, and a part of the error's message.
type graphErrorCase struct {
	name    string
	build   func(g *Graph)
	wantMsg string
}

// runGraphErrorCases builds each case on a graph of its own: the graph's error is an ErrGraph
// whose message holds wantMsg.
func runGraphErrorCases(t *testing.T, tests []graphErrorCase) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGraph()
			tc.build(g)
			err := g.Err()
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrGraph)
			assert.Contains(t, err.Error(), tc.wantMsg)
		})
	}
}

func TestInferShapes(t *testing.T) {
	runInferCases(t, []inferCase{
		{"broadcast add", func(g *Graph) *Tensor {
			return g.Add(g.Input("a", F32, 2, 3, 4), g.Input("b", F32, 3, 1))
		}, F32, Shape{2, 3, 4}},
		{"matmul weight", func(g *Graph) *Tensor {
			w := g.Const("w", Q8_0, Shape{8, 64}, make([]byte, Q8_0.Bytes(8*64)))
			return g.MatMul(g.Input("x", F32, 5, 64), w)
		}, F32, Shape{5, 8}},
		{"matmul batched broadcast", func(g *Graph) *Tensor {
			return g.MatMul(g.Input("a", F16, 3, 1, 4, 6), g.Input("b", F16, 2, 5, 6))
		}, F16, Shape{3, 2, 4, 5}},
		{"matmul rank-1 a", func(g *Graph) *Tensor {
			return g.MatMul(g.Input("a", F32, 6), g.Input("b", F32, 5, 6))
		}, F32, Shape{5}},
		{"attention gqa", func(g *Graph) *Tensor {
			return g.Attention(g.Input("q", F32, 7, 8, 16), g.Input("k", F16, 20, 2, 16),
				g.Input("v", F16, 20, 2, 12), AttentionOptions{Causal: true, QOffset: 13})
		}, F32, Shape{7, 8, 12}},
		{"get rows", func(g *Graph) *Tensor {
			tab := g.Const("emb", Q4_0, Shape{10, 32}, make([]byte, Q4_0.Bytes(320)))
			return g.GetRows(tab, g.Input("ids", I32, 2, 3))
		}, F32, Shape{2, 3, 32}},
		{"rope", func(g *Graph) *Tensor {
			return g.RoPE(g.Input("x", F32, 4, 2, 8), g.Input("pos", I32, 4), RoPEOptions{Mode: RoPENeoX, Dims: 4})
		}, F32, Shape{4, 2, 8}},
		{"permute", func(g *Graph) *Tensor {
			return g.Permute(g.Input("x", F32, 2, 3, 4), 2, 0, 1)
		}, F32, Shape{4, 2, 3}},
		{"slice", func(g *Graph) *Tensor { return g.Slice(g.Input("x", I32, 5, 6), 1, 2, 3) }, I32, Shape{5, 3}},
		{"concat", func(g *Graph) *Tensor {
			return g.Concat(0, g.Input("a", F32, 2, 3), g.Input("b", F32, 4, 3), g.Input("c", F32, 1, 3))
		}, F32, Shape{7, 3}},
		{"cast", func(g *Graph) *Tensor { return g.Cast(g.Input("x", F32, 3), BF16) }, BF16, Shape{3}},
		{"quantize", func(g *Graph) *Tensor { return g.Quantize(g.Input("x", F32, 2, 64), Q4_0, 0) }, Q4_0, Shape{2, 64}},
		{"reshape", func(g *Graph) *Tensor { return g.Reshape(g.Input("x", F32, 2, 6), 3, 4) }, F32, Shape{3, 4}},
		{"matmul q4_k", func(g *Graph) *Tensor {
			return g.MatMul(g.Input("a", F32, 3, 512), g.Input("w", Q4_K, 7, 512))
		}, F32, Shape{3, 7}},
		{"get rows q6_k", func(g *Graph) *Tensor {
			return g.GetRows(g.Input("emb", Q6_K, 10, 256), g.Input("ids", I32, 4))
		}, F32, Shape{4, 256}},
		{"quantize q5_k", func(g *Graph) *Tensor { return g.Quantize(g.Input("x", F32, 2, 256), Q5_K, 0) }, Q5_K, Shape{2, 256}},
		{"dequantize q3_k", func(g *Graph) *Tensor { return g.Dequantize(g.Input("x", Q3_K, 256), 0) }, F32, Shape{256}},
		{"zero-size unary", func(g *Graph) *Tensor { return g.SiLU(g.Input("x", F32, 0, 4)) }, F32, Shape{0, 4}},
	}, nil)
}

func TestBuildErrorsNameTheNode(t *testing.T) {
	runGraphErrorCases(t, []graphErrorCase{
		{"inner dims", func(g *Graph) {
			g.Named("attn_q").MatMul(g.Input("x", F32, 2, 64), g.Input("w", F32, 8, 32))
		}, `"attn_q" (MATMUL): inner dims differ`},
		{"broadcast", func(g *Graph) {
			g.Add(g.Input("a", F32, 2, 3), g.Input("b", F32, 4))
		}, "do not broadcast"},
		{"dtype mix", func(g *Graph) {
			g.Mul(g.Input("a", F32, 2), g.Input("b", F16, 2))
		}, "dtypes differ"},
		{"gqa heads", func(g *Graph) {
			g.Attention(g.Input("q", F32, 1, 6, 4), g.Input("k", F32, 3, 4, 4), g.Input("v", F32, 3, 4, 4), AttentionOptions{})
		}, "not a multiple of kv heads"},
		{"kv head range past k", func(g *Graph) {
			g.Attention(g.Input("q", F32, 1, 4, 4), g.Input("k", F32, 3, 4, 4), g.Input("v", F32, 3, 4, 4),
				AttentionOptions{KVHeadOffset: 3, KVHeads: 2})
		}, "kv head range [3, 3+2) outside k's 4 heads"},
		{"kv head offset without a count", func(g *Graph) {
			g.Attention(g.Input("q", F32, 1, 4, 4), g.Input("k", F32, 3, 4, 4), g.Input("v", F32, 3, 4, 4),
				AttentionOptions{KVHeadOffset: 1})
		}, "outside k's 4 heads"},
		{"kv head range gqa", func(g *Graph) {
			g.Attention(g.Input("q", F32, 1, 3, 4), g.Input("k", F32, 3, 4, 4), g.Input("v", F32, 3, 4, 4),
				AttentionOptions{KVHeadOffset: 2, KVHeads: 2})
		}, "query heads 3 not a multiple of kv heads 2"},
		{"q4 rows", func(g *Graph) { g.Input("w", Q4_0, 4, 33) }, "multiple of 32"},
		{"k-quant rows", func(g *Graph) { g.Input("w", Q4_K, 4, 288) }, "multiple of 256"},
		{"k-quant quantize", func(g *Graph) { g.Quantize(g.Input("x", F32, 2, 128), Q2_K, 0) }, "multiple of 256"},
		{"k-quant matmul rank", func(g *Graph) {
			g.MatMul(g.Input("x", F32, 2, 256), g.Input("w", Q6_K, 2, 4, 256))
		}, "must be rank 2"},
		{"const size", func(g *Graph) { g.Const("w", F32, Shape{2, 2}, make([]byte, 15)) }, "want 16"},
		{"rope pos", func(g *Graph) {
			g.RoPE(g.Input("x", F32, 4, 2, 8), g.Input("pos", I32, 3), RoPEOptions{})
		}, "positions must be i32 [4]"},
		{"rope odd dims", func(g *Graph) {
			g.RoPE(g.Input("x", F32, 4, 2, 8), g.Input("pos", I32, 4), RoPEOptions{Dims: 3})
		}, "must be even"},
		{"slice range", func(g *Graph) { g.Slice(g.Input("x", F32, 5), 0, 3, 3) }, "out of range"},
		{"permute", func(g *Graph) { g.Permute(g.Input("x", F32, 2, 3), 0, 0) }, "not a permutation"},
		{"reshape count", func(g *Graph) { g.Reshape(g.Input("x", F32, 2, 6), 5) }, "element count"},
		{"quantize i8 scale", func(g *Graph) { g.Quantize(g.Input("x", F32, 4), I8, 0) }, "positive scale"},
		{"quantized matmul rank", func(g *Graph) {
			g.MatMul(g.Input("x", F32, 2, 32), g.Input("w", Q8_0, 2, 4, 32))
		}, "must be rank 2"},
		{"cast from q8", func(g *Graph) { g.Cast(g.Input("x", Q8_0, 32), F32) }, "not allowed"},
		{"rank 5", func(g *Graph) { g.Input("x", F32, 1, 1, 1, 1, 1) }, "rank 5"},
		{"prefix names the layer", func(g *Graph) {
			g.SetNamePrefix("blk.3.")
			g.Named("ffn_up").MatMul(g.Input("x", F32, 2, 8), g.Input("w", F32, 4, 7))
		}, `"blk.3.ffn_up"`},
	})
}

func TestFirstErrorSticks(t *testing.T) {
	g := NewGraph()
	x := g.Input("x", F32, 2, 3)
	bad := g.Add(x, g.Input("y", F32, 4))
	assert.Nil(t, bad)
	assert.Nil(t, g.SiLU(bad)) // later calls are no-ops, no panic on nil
	assert.Contains(t, g.Err().Error(), "broadcast")
}

func TestValidateCatchesEdits(t *testing.T) {
	g := NewGraph()
	y := g.SiLU(g.Input("x", F32, 3))
	g.Output(y)
	require.NoError(t, g.Validate())
	y.Shape = Shape{4}
	assert.ErrorContains(t, g.Validate(), "inputs give f32[3]")
	assert.ErrorContains(t, NewGraph().Validate(), "no outputs")

	g2 := NewGraph()
	p := g2.Permute(g2.Input("x", F32, 2, 3), 1, 0)
	g2.Output(p)
	g2.Tensors[0].Shape = make(Shape, 9) // a hand-edited graph must give an error, not a panic
	assert.ErrorContains(t, g2.Validate(), "rank 9")
	g2.Nodes[0].Output = nil
	assert.ErrorContains(t, g2.Validate(), "nil")
}

func TestUniqueNames(t *testing.T) {
	g := NewGraph()
	x := g.Input("x", F32, 2)
	a, b := g.SiLU(x), g.SiLU(x)
	assert.Equal(t, "silu", a.Name)
	assert.Equal(t, "silu.1", b.Name)
	got, ok := g.Tensor("silu.1")
	assert.True(t, ok)
	assert.Same(t, b, got)
}

func ExampleGraph() {
	g := NewGraph()
	x := g.Input("x", F32, 4, 64)
	w := g.Const("w", F32, Shape{32, 64}, make([]byte, 4*32*64))
	y := g.Rename(g.MatMul(g.RMSNorm(x, 1e-5), w), "proj")
	g.Output(g.SiLU(y))
	if err := g.Err(); err != nil {
		panic(err)
	}
	fmt.Println(y)
	// Output: proj f32[4,32]
}

func TestBinding(t *testing.T) {
	g := NewGraph()
	a := g.Input("a", F32, 2)
	b := g.Input("b", F32, 2)
	y := g.Add(a, b)
	g.Output(y)
	for _, tc := range []struct {
		io   int
		want *Tensor
	}{{-1, nil}, {0, a}, {1, b}, {2, y}, {3, nil}} {
		got, err := g.Binding(tc.io)
		if tc.want == nil {
			require.ErrorIs(t, err, ErrInvalidArgument, "io %d", tc.io)
			continue
		}
		require.NoError(t, err, "io %d", tc.io)
		require.Same(t, tc.want, got, "io %d", tc.io)
	}
}

// Element counts must never wrap: 65552*61681*4562284561 = 2^64+16, so before the bound a
// reshape of 16 elements to that shape passed the count check and backends (core/ref's
// permute, OpenCL) indexed far outside their buffers.
func TestShapesAreBounded(t *testing.T) {
	wrap16 := []int64{65552, 61681, 4562284561}
	runGraphErrorCases(t, []graphErrorCase{
		{"input dim", func(g *Graph) { g.Input("x", F32, MaxDim+1) }, "larger than 2^40"},
		{"input product", func(g *Graph) { g.Input("x", F32, wrap16...) }, "more than 2^40 elements"},
		{"input product past int64", func(g *Graph) { g.Input("x", F32, MaxDim, MaxDim, MaxDim) }, "more than 2^40 elements"},
		{"const product", func(g *Graph) { g.Const("w", F32, Shape{1 << 21, 1 << 20}, nil) }, "more than 2^40 elements"},
		{"reshape that wraps to the same count", func(g *Graph) {
			g.Named("wrapped").Permute(g.Reshape(g.Input("x", F32, 16), wrap16...), 2, 1, 0)
		}, `"wrapped" (RESHAPE): shape [65552,61681,4562284561] has more than 2^40 elements`},
		{"broadcast output", func(g *Graph) {
			g.Named("big_add").Add(g.Input("a", F32, 1<<21, 1), g.Input("b", F32, 1<<20))
		}, `"big_add" (ADD): output: shape [2097152,1048576] has more than 2^40 elements`},
		{"matmul output", func(g *Graph) {
			g.Named("big_mm").MatMul(g.Input("a", F32, 1<<21, 1), g.Input("b", F32, 1<<20, 1))
		}, `"big_mm" (MATMUL): output: shape`},
	})

	t.Run("at the bound", func(t *testing.T) {
		g := NewGraph()
		x := g.Input("x", F32, 1<<20, 1<<20)
		g.Output(g.Reshape(x, MaxElements))
		require.NoError(t, g.Err())
		assert.Equal(t, MaxElements, g.Outputs[0].Shape.NumElements())
	})

	t.Run("hand-edited graph", func(t *testing.T) {
		g := NewGraph()
		g.Output(g.ReLU(g.Input("x", F32, 16)))
		require.NoError(t, g.Validate())
		g.Tensors[0].Shape = wrap16
		assert.ErrorContains(t, g.Validate(), "more than 2^40 elements")
	})
}

// A graph is written with the lowest op set that holds it, so op-set-1 plugins keep running
// every graph without a v2 feature.
func TestGraphOpset(t *testing.T) {
	g := NewGraph()
	x := g.Input("x", F32, 1, 256)
	g.Output(g.MatMul(x, g.Input("w", Q4_0, 8, 256)))
	require.EqualValues(t, 1, g.Opset())
	g.Output(g.MatMul(x, g.Input("wk", Q4_K, 8, 256)))
	require.EqualValues(t, 2, g.Opset())
	k := g.Input("k", F32, 5, 4, 8)
	whole := g.Attention(g.Input("q", F32, 1, 8, 8), k, k, AttentionOptions{})
	g.Output(whole)
	require.EqualValues(t, 2, g.Opset(), "an ATTENTION over all the KV heads is op set 1")
	part := g.Attention(g.Input("q2", F32, 1, 4, 8), k, k, AttentionOptions{KVHeadOffset: 2, KVHeads: 2})
	g.Output(part)
	require.NoError(t, g.Err())
	assert.Equal(t, Shape{1, 4, 8}, part.Shape)
	require.EqualValues(t, 4, g.Opset(), "a KV head range is op set 4")
}

// A tree's mask row marks the token and its ancestors: siblings do not see each other, and a
// second root starts a tree of its own.
func TestTreeMask(t *testing.T) {
	assert.Equal(t, []byte{
		1, 0, 0, 0, 0,
		1, 1, 0, 0, 0,
		1, 0, 1, 0, 0, // a sibling of token 1
		1, 0, 1, 1, 0,
		0, 0, 0, 0, 1, // a second root
	}, TreeMask([]int{-1, 0, 0, 2, -1}))
	assert.Empty(t, TreeMask(nil))
}
