package ref

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// randomTree draws parents for T tokens in topological order (a parent precedes its child).
func randomTree(r *rand.Rand, T int) []int {
	p := make([]int, T)
	for i := range p {
		p[i] = r.IntN(i+1) - 1
	}
	return p
}

func randF32(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// bruteAttention is attention written from OPS.md's sentences, one query and head at a time in
// float64: query i sees the keys keys(i), and each score s becomes softCap·tanh(s/softCap) when
// softCap > 0.
func bruteAttention(q, k, v []float32, Tq, Hq, D, Hkv, Dv int, keys func(i int) []int, softCap float64) []float32 {
	out := make([]float32, Tq*Hq*Dv)
	scale := 1 / math.Sqrt(float64(D))
	for i := 0; i < Tq; i++ {
		seen := keys(i)
		for h := 0; h < Hq; h++ {
			hk := h / (Hq / Hkv)
			s := make([]float64, len(seen))
			mx := math.Inf(-1)
			for x, j := range seen {
				for d := 0; d < D; d++ {
					s[x] += float64(q[(i*Hq+h)*D+d]) * float64(k[(j*Hkv+hk)*D+d])
				}
				s[x] *= scale
				if softCap > 0 {
					s[x] = softCap * math.Tanh(s[x]/softCap)
				}
				mx = math.Max(mx, s[x])
			}
			sum := 0.0
			for x := range s {
				s[x] = math.Exp(s[x] - mx)
				sum += s[x]
			}
			for d := 0; d < Dv; d++ {
				acc := 0.0
				for x, j := range seen {
					acc += s[x] / sum * float64(v[(j*Hkv+hk)*Dv+d])
				}
				out[(i*Hq+h)*Dv+d] = float32(acc)
			}
		}
	}
	return out
}

// maskedKeys are the keys of masked attention: query i sees keys [0, off) and off+j where
// mask[i,j] != 0.
func maskedKeys(Tq, off int, mask []byte) func(i int) []int {
	return func(i int) []int {
		var keys []int
		for j := 0; j < off; j++ {
			keys = append(keys, j)
		}
		for j := 0; j < Tq; j++ {
			if mask[i*Tq+j] != 0 {
				keys = append(keys, off+j)
			}
		}
		return keys
	}
}

// maskedGraph is attention of q [Tq,Hq,D] over a KV cache of capacity Tk with inputs
// q_offset and mask (mask nil: plain causal with the q_offset input).
func maskedGraph(t *testing.T, q, k, v []float32, Tq, Hq, D, Tk, Hkv, Dv int, withMask bool) *core.Graph {
	t.Helper()
	g := core.NewGraph()
	qt := c32(g, core.Shape{int64(Tq), int64(Hq), int64(D)}, q...)
	kt := c32(g, core.Shape{int64(Tk), int64(Hkv), int64(D)}, k...)
	vt := c32(g, core.Shape{int64(Tk), int64(Hkv), int64(Dv)}, v...)
	o := core.AttentionOptions{Causal: true, QOffsetInput: g.Input("q_offset", core.I32, 1)}
	if withMask {
		o.Mask = g.Input("mask", core.I8, int64(Tq), int64(Tq))
	}
	g.Output(g.Attention(qt, kt, vt, o))
	require.NoError(t, g.Err())
	return g
}

func TestAttentionMaskLowerTriangularIsCausal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ Tq, Hq, Hkv, D, Dv, off int }{
		{1, 1, 1, 4, 4, 0}, {5, 2, 1, 8, 4, 0}, {7, 4, 2, 8, 8, 3}, {16, 4, 1, 16, 16, 9},
	} {
		Tk := c.off + c.Tq + 3 // three garbage rows past the block
		q := randF32(r, c.Tq*c.Hq*c.D)
		k := randF32(r, Tk*c.Hkv*c.D)
		v := randF32(r, Tk*c.Hkv*c.Dv)
		for j := (c.off + c.Tq) * c.Hkv; j < Tk*c.Hkv; j++ {
			for d := 0; d < c.D; d++ {
				k[j*c.D+d] = nan
			}
			for d := 0; d < c.Dv; d++ {
				v[j*c.Dv+d] = nan
			}
		}
		tri := make([]byte, c.Tq*c.Tq)
		for i := 0; i < c.Tq; i++ {
			for j := 0; j <= i; j++ {
				tri[i*c.Tq+j] = 1
			}
		}
		off := core.EncodeI32([]int32{int32(c.off)})
		causal, err := Run(context.Background(), maskedGraph(t, q, k, v, c.Tq, c.Hq, c.D, Tk, c.Hkv, c.Dv, false), [][]byte{off})
		require.NoError(t, err)
		masked, err := Run(context.Background(), maskedGraph(t, q, k, v, c.Tq, c.Hq, c.D, Tk, c.Hkv, c.Dv, true), [][]byte{off, tri})
		require.NoError(t, err)
		require.Equal(t, causal[0], masked[0], "case %+v", c)
	}
}

func TestAttentionTreeMaskMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for n := 0; n < 24; n++ {
		Tq := 1 + r.IntN(20)
		Hkv := 1 + r.IntN(2)
		Hq := Hkv * (1 + r.IntN(3))
		D, Dv := 4*(1+r.IntN(3)), 4*(1+r.IntN(3))
		off := r.IntN(6)
		Tk := off + Tq + r.IntN(3)
		q, k, v := randF32(r, Tq*Hq*D), randF32(r, Tk*Hkv*D), randF32(r, Tk*Hkv*Dv)
		var mask []byte
		if n%3 == 2 { // an arbitrary mask, not a tree, with some empty rows
			mask = make([]byte, Tq*Tq)
			for i := range mask {
				mask[i] = byte(r.IntN(3)) // 2 counts as visible too
			}
		} else {
			mask = core.TreeMask(randomTree(r, Tq))
		}
		want := bruteAttention(q, k, v, Tq, Hq, D, Hkv, Dv, maskedKeys(Tq, off, mask), 0)
		g := maskedGraph(t, q, k, v, Tq, Hq, D, Tk, Hkv, Dv, true)
		res, err := Run(context.Background(), g, [][]byte{core.EncodeI32([]int32{int32(off)}), mask})
		require.NoError(t, err)
		got, err := core.Dequantize(core.F32, res[0], 0)
		require.NoError(t, err)
		assertFloats(t, want, got, 1e-5)
	}
}

func TestAttentionMask(t *testing.T) {
	k3 := []float32{0, 0, 0, 0, nan, nan}
	v3 := []float32{1, 2, 3, 6, nan, nan}
	vClean := []float32{1, 2, 3, 6, 5, 10}
	buildKV := func(Tq int64, k, v []float32) func(g *core.Graph) *core.Tensor {
		return func(g *core.Graph) *core.Tensor {
			q := g.Const("q", core.F32, core.Shape{Tq, 1, 2}, make([]byte, 4*2*Tq))
			return g.Attention(q, c32(g, core.Shape{3, 1, 2}, k...), c32(g, core.Shape{3, 1, 2}, v...),
				core.AttentionOptions{Causal: true, QOffsetInput: g.Input("off", core.I32, 1),
					Mask: g.Input("mask", core.I8, Tq, Tq)})
		}
	}
	build := func(Tq int64) func(g *core.Graph) *core.Tensor { return buildKV(Tq, k3, v3) }
	i32 := func(v int32) []byte { return core.EncodeI32([]int32{v}) }
	runCases(t, []opCase{
		// Siblings: query 1 does not see key 0 (its sibling) and reads no garbage row.
		{name: "siblings", build: build(2), inputs: [][]byte{i32(0), {1, 0, 0, 1}}, want: []float32{1, 2, 3, 6}},
		{name: "prefix always visible", build: build(2), inputs: [][]byte{i32(1), {0, 0, 0, 0}}, want: []float32{1, 2, 1, 2}},
		{name: "all masked at offset 0 gives 0", build: build(1), inputs: [][]byte{i32(0), {0}}, want: []float32{0, 0}},
		{name: "block past the cache is clipped", build: buildKV(2, make([]float32, 6), vClean), inputs: [][]byte{i32(2), {1, 1, 1, 1}}, want: []float32{3, 6, 3, 6}},
		{name: "negative offset", build: build(2), inputs: [][]byte{i32(-1), {1, 1, 1, 1}}, want: []float32{1, 2, 1, 2}},
	})
}

func TestAttentionMaskBuilderChecks(t *testing.T) {
	for _, c := range []struct {
		name  string
		build func(g *core.Graph, q, kv *core.Tensor)
	}{
		{"mask without q_offset input", func(g *core.Graph, q, kv *core.Tensor) {
			g.Attention(q, kv, kv, core.AttentionOptions{Causal: true, Mask: g.Input("m", core.I8, 2, 2)})
		}},
		{"mask on non-causal", func(g *core.Graph, q, kv *core.Tensor) {
			g.Attention(q, kv, kv, core.AttentionOptions{QOffsetInput: g.Input("o", core.I32, 1), Mask: g.Input("m", core.I8, 2, 2)})
		}},
		{"mask wrong dtype", func(g *core.Graph, q, kv *core.Tensor) {
			g.Attention(q, kv, kv, core.AttentionOptions{Causal: true, QOffsetInput: g.Input("o", core.I32, 1), Mask: g.Input("m", core.I32, 2, 2)})
		}},
		{"mask wrong shape", func(g *core.Graph, q, kv *core.Tensor) {
			g.Attention(q, kv, kv, core.AttentionOptions{Causal: true, QOffsetInput: g.Input("o", core.I32, 1), Mask: g.Input("m", core.I8, 2, 3)})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := core.NewGraph()
			c.build(g, g.Input("q", core.F32, 2, 1, 4), g.Input("kv", core.F32, 4, 1, 4))
			require.ErrorIs(t, g.Err(), core.ErrGraph)
		})
	}
}
