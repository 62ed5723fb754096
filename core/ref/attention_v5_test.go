package ref

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// windowKeys are the keys of op set 5's causal attention: query i sees keys
// (i+off-window, i+off] (window 0: all of [0, i+off]).
func windowKeys(off, window int) func(i int) []int {
	return func(i int) []int {
		first := 0
		if window > 0 {
			first = max(0, i+off-window+1)
		}
		var keys []int
		for j := first; j <= i+off; j++ {
			keys = append(keys, j)
		}
		return keys
	}
}

func TestAttentionSoftCapAndWindow(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		name                     string
		Tq, Hq, Hkv, D, off, win int
		softCap                  float32
	}{
		{"soft-cap decode", 1, 4, 2, 8, 9, 0, 0.5},
		{"soft-cap prefill", 6, 2, 1, 8, 0, 0, 2},
		{"window decode", 1, 4, 2, 8, 12, 4, 0},
		{"window prefill past the window", 9, 2, 2, 8, 3, 3, 0},
		{"window larger than the keys", 4, 2, 1, 8, 2, 64, 0},
		{"window of one", 5, 2, 1, 8, 1, 1, 0},
		{"gemma: both", 7, 4, 1, 16, 5, 4, 1.5},
	} {
		t.Run(c.name, func(t *testing.T) {
			Tk := c.off + c.Tq + 2 // two garbage rows past the last key
			q := randF32(r, c.Tq*c.Hq*c.D)
			for i := range q {
				q[i] *= 4 // scores well beyond the cap
			}
			k, v := randF32(r, Tk*c.Hkv*c.D), randF32(r, Tk*c.Hkv*c.D)
			for j := (c.off + c.Tq) * c.Hkv * c.D; j < len(k); j++ {
				k[j], v[j] = nan, nan
			}
			g := core.NewGraph()
			o := core.AttentionOptions{Causal: true, QOffsetInput: g.Input("q_offset", core.I32, 1),
				SoftCap: c.softCap, Window: int64(c.win)}
			g.Output(g.Attention(c32(g, core.Shape{int64(c.Tq), int64(c.Hq), int64(c.D)}, q...),
				c32(g, core.Shape{int64(Tk), int64(c.Hkv), int64(c.D)}, k...),
				c32(g, core.Shape{int64(Tk), int64(c.Hkv), int64(c.D)}, v...), o))
			require.NoError(t, g.Err())
			require.EqualValues(t, 5, g.Opset())
			res, err := Run(context.Background(), g, [][]byte{core.EncodeI32([]int32{int32(c.off)})})
			require.NoError(t, err)
			got, err := core.Dequantize(core.F32, res[0], 0)
			require.NoError(t, err)
			assertFloats(t, bruteAttention(q, k, v, c.Tq, c.Hq, c.D, c.Hkv, c.D, windowKeys(c.off, c.win), float64(c.softCap)), got, 1e-5)
		})
	}
}

// A Q8_0/Q4_0 K/V cache attends exactly as its dequantized f32 copy does.
func TestAttentionQuantizedKV(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const Tq, Hq, Hkv, D, Tk = 3, 4, 2, 64, 10
	q, k, v := randF32(r, Tq*Hq*D), randF32(r, Tk*Hkv*D), randF32(r, Tk*Hkv*D)
	for _, kdt := range []core.DType{core.Q8_0, core.Q4_0, core.F16} {
		for _, vdt := range []core.DType{core.Q8_0, core.Q4_0, core.F32} {
			kq, err := core.Quantize(kdt, k, 0)
			require.NoError(t, err)
			vq, err := core.Quantize(vdt, v, 0)
			require.NoError(t, err)
			kd, err := core.Dequantize(kdt, kq, 0)
			require.NoError(t, err)
			vd, err := core.Dequantize(vdt, vq, 0)
			require.NoError(t, err)
			g := core.NewGraph()
			g.Output(g.Attention(c32(g, core.Shape{Tq, Hq, D}, q...),
				g.Const("k", kdt, core.Shape{Tk, Hkv, D}, kq), g.Const("v", vdt, core.Shape{Tk, Hkv, D}, vq),
				core.AttentionOptions{Causal: true, QOffset: 4}))
			require.NoError(t, g.Err())
			res, err := Run(context.Background(), g, nil)
			require.NoError(t, err)
			got, err := core.Dequantize(core.F32, res[0], 0)
			require.NoError(t, err)
			assertFloats(t, bruteAttention(q, kd, vd, Tq, Hq, D, Hkv, D, windowKeys(4, 0), 0), got, 1e-5)
		}
	}
}

func TestAttentionV5BuilderChecks(t *testing.T) {
	for _, c := range []struct {
		name  string
		build func(g *core.Graph) *core.Tensor
	}{
		{"window without causal", func(g *core.Graph) *core.Tensor {
			x := g.Input("x", core.F32, 2, 1, 32)
			return g.Attention(x, x, x, core.AttentionOptions{Window: 4})
		}},
		{"window with a mask", func(g *core.Graph) *core.Tensor {
			x := g.Input("x", core.F32, 2, 1, 32)
			return g.Attention(x, x, x, core.AttentionOptions{Causal: true, Window: 4,
				QOffsetInput: g.Input("o", core.I32, 1), Mask: g.Input("m", core.I8, 2, 2)})
		}},
		{"negative window", func(g *core.Graph) *core.Tensor {
			x := g.Input("x", core.F32, 2, 1, 32)
			return g.Attention(x, x, x, core.AttentionOptions{Causal: true, Window: -1})
		}},
		{"NaN soft-cap", func(g *core.Graph) *core.Tensor {
			x := g.Input("x", core.F32, 2, 1, 32)
			return g.Attention(x, x, x, core.AttentionOptions{SoftCap: float32(math.NaN())})
		}},
		{"negative soft-cap", func(g *core.Graph) *core.Tensor {
			x := g.Input("x", core.F32, 2, 1, 32)
			return g.Attention(x, x, x, core.AttentionOptions{SoftCap: -1})
		}},
		{"q8_0 k with head dim 16", func(g *core.Graph) *core.Tensor {
			q := g.Input("q", core.F32, 2, 1, 16)
			kv := g.Input("kv", core.Q8_0, 4, 1, 16)
			return g.Attention(q, kv, kv, core.AttentionOptions{Causal: true})
		}},
		{"q4_k k", func(g *core.Graph) *core.Tensor {
			q := g.Input("q", core.F32, 2, 1, 256)
			kv := g.Input("kv", core.Q4_K, 4, 1, 256)
			return g.Attention(q, kv, kv, core.AttentionOptions{Causal: true})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := core.NewGraph()
			c.build(g)
			require.Error(t, g.Err())
		})
	}
}

func TestTanh(t *testing.T) {
	xs := []float32{0, 0.5, -2, 20, -20, nan}
	g := core.NewGraph()
	g.Output(g.Tanh(c32(g, core.Shape{6}, xs...)))
	require.NoError(t, g.Err())
	require.EqualValues(t, 5, g.Opset())
	res, err := Run(context.Background(), g, nil)
	require.NoError(t, err)
	got, err := core.Dequantize(core.F32, res[0], 0)
	require.NoError(t, err)
	want := make([]float32, len(xs))
	for i, x := range xs {
		want[i] = float32(math.Tanh(float64(x)))
	}
	assertFloats(t, want, got, 1e-7)
}
