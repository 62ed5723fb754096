package arch

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/xpuhub/xpu/core"
)

// zeroHost gives every weight of a model as an F32 constant of zeros, of the shape its builder
// declares, and its projections as plain matrix products.
type zeroHost map[string]core.Shape

func newZeroHost(c *Config, b Builder) zeroHost {
	h := zeroHost{
		"token_embd.weight":  {int64(c.Vocab), int64(c.Dim)},
		"output_norm.weight": {int64(c.Dim)},
		"output.weight":      {int64(c.Vocab), int64(c.Dim)},
	}
	for l := range c.Layers {
		for _, s := range b.Tensors(c, l) {
			h[s.Name] = s.Shape
		}
	}
	return h
}

func (h zeroHost) Weight(g *core.Graph, name string) *core.Tensor {
	s := h[name]
	return g.Const(name, core.F32, s, make([]byte, 4*s.NumElements()))
}

func (h zeroHost) Linear(g *core.Graph, x *core.Tensor, l int, name string) *core.Tensor {
	return g.Named(name).MatMul(x, h.Weight(g, LayerName(l, name+".weight")))
}

// testConfig is a two-layer Llama with grouped queries (2 heads over 1 KV head of 32: one
// quantization block).
func testConfig() Config {
	return Config{Arch: "llama", Dim: 64, Layers: 2, FFN: 128, Heads: 2, KVHeads: 1, HeadDim: 32, RopeDims: 32,
		RopeBase: 10000, RopeFreqScale: 1, RopeMode: core.RoPENormal, NormEps: 1e-5, Vocab: 32}
}

// names are the names of ts.
func names(ts []*core.Tensor) []string {
	var n []string
	for _, t := range ts {
		n = append(n, t.Name)
	}
	return n
}

func TestStageGraphs(t *testing.T) {
	const C, capacity = 8, 16
	factors := testConfig()
	factors.RopeFreqFactors = make([]float32, factors.RopeDims/2)
	for i := range factors.RopeFreqFactors {
		factors.RopeFreqFactors[i] = 1
	}
	cfg := testConfig()
	D, H, Hkv := int64(cfg.Dim), int64(cfg.Heads), int64(cfg.KVHeads)
	qkv := []core.Shape{{C, D}, {C, H, 32}, {C, Hkv, 32}, {C, Hkv, 32}} // x, q, k, v
	for _, tc := range []struct {
		name     string
		cfg      Config
		st       Stage
		s        int // 0: embedding; s: layer s-1
		inputs   []string
		outputs  []core.Shape
		outTypes []core.DType
	}{
		{"embedding", cfg, Stage{C: C, Capacity: capacity, K: core.F16, V: core.F16}, 0,
			[]string{"ids", "pos"}, qkv, []core.DType{core.F32, core.F32, core.F16, core.F16}},
		{"embedding with RoPE factors", factors, Stage{C: C, Capacity: capacity, K: core.F32, V: core.F32}, 0,
			[]string{"ids", "rope_cos", "rope_sin"}, qkv, []core.DType{core.F32, core.F32, core.F32, core.F32}},
		{"first layer, quantized cache", cfg, Stage{C: C, Capacity: capacity, K: core.Q8_0, V: core.F16}, 1,
			[]string{"x", "q", "k_cache", "v_cache", "q_offset", "pos"}, qkv,
			[]core.DType{core.F32, core.F32, core.Q8_0, core.F16}},
		{"last layer: logits", cfg, Stage{C: C, Capacity: capacity, K: core.F16, V: core.F16}, 2,
			[]string{"x", "q", "k_cache", "v_cache", "q_offset"}, []core.Shape{{C, int64(cfg.Vocab)}}, []core.DType{core.F32}},
		{"last layer: hidden state", cfg, Stage{C: C, Capacity: capacity, K: core.F16, V: core.F16, Hidden: true}, 2,
			[]string{"x", "q", "k_cache", "v_cache", "q_offset"}, []core.Shape{{C, D}}, []core.DType{core.F32}},
		{"draft tree", cfg, Stage{C: C, Capacity: capacity, K: core.F16, V: core.F16, Tree: true}, 1,
			[]string{"x", "q", "k_cache", "v_cache", "q_offset", "mask", "pos"}, qkv,
			[]core.DType{core.F32, core.F32, core.F16, core.F16}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, ok := Lookup(tc.cfg.Arch)
			require.True(t, ok)
			g := core.NewGraph()
			blk := NewBlock(g, &tc.cfg, b, newZeroHost(&tc.cfg, b))
			if tc.s == 0 {
				require.NoError(t, tc.st.Embed(blk))
			} else {
				require.NoError(t, tc.st.Layer(blk, tc.s-1))
			}
			assert.Equal(t, tc.inputs, names(g.Inputs))
			require.Len(t, g.Outputs, len(tc.outputs))
			for i, o := range g.Outputs {
				assert.Equal(t, tc.outputs[i], o.Shape, "output %d", i)
				assert.Equal(t, tc.outTypes[i], o.DType, "output %d", i)
			}
		})
	}
}

func TestStageErrors(t *testing.T) {
	cfg := testConfig()
	b, _ := Lookup(cfg.Arch)
	narrow := cfg // a head of 16: half a Q8_0 block
	narrow.Dim, narrow.HeadDim, narrow.RopeDims = 32, 16, 16
	for _, tc := range []struct {
		name string
		cfg  Config
		st   Stage
		s    int
		want string
	}{
		{"a quantized cache over half a block", narrow, Stage{C: 4, Capacity: 8, K: core.Q8_0, V: core.F16}, 1, "building layer 0"},
		{"new rows into half a block", narrow, Stage{C: 4, Capacity: 8, K: core.F16, V: core.Q4_0}, 0, "building the embedding stage"},
		{"a negative chunk", cfg, Stage{C: -1, Capacity: 8, K: core.F16, V: core.F16}, 0, "building the embedding stage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := core.NewGraph()
			blk := NewBlock(g, &tc.cfg, b, newZeroHost(&tc.cfg, b))
			var err error
			if tc.s == 0 {
				err = tc.st.Embed(blk)
			} else {
				err = tc.st.Layer(blk, tc.s-1)
			}
			require.ErrorIs(t, err, core.ErrGraph)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestStageRefusesATreeOverASlidingWindow(t *testing.T) {
	cfg := testConfig()
	cfg.SlidingWindow = 4
	b, _ := Lookup(cfg.Arch)
	for _, tc := range []struct {
		name     string
		capacity int64
		err      error
	}{
		{"the window hides rows", 16, core.ErrUnsupported},
		{"the window covers the cache", 4, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := core.NewGraph()
			st := Stage{C: 4, Capacity: tc.capacity, K: core.F32, V: core.F32, Tree: true}
			err := st.Layer(NewBlock(g, &cfg, b, newZeroHost(&cfg, b)), 0)
			if tc.err == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.err)
			assert.Contains(t, err.Error(), "sliding window of 4")
		})
	}
}

func TestStageNames(t *testing.T) {
	for _, c := range []struct {
		s    int
		want string
	}{
		{0, "stage 0 (embedding, layer 0's q/k/v)"},
		{1, "stage 1 (layer 0)"},
		{3, "stage 3 (layer 2, output head)"},
	} {
		assert.Equal(t, c.want, StageName(c.s, 3))
	}
	g := core.NewGraph()
	x := g.Input("x", core.F32, 4)
	g.Output(g.Neg(x))
	assert.Equal(t, "logits", OutputRole(g, 0), "a stage with one output ends the model")
	g.Output(g.Neg(x), g.Neg(x), g.Neg(x), g.Neg(x))
	for i, want := range []string{"x", "q", "k", "v", "4"} {
		assert.Equal(t, want, OutputRole(g, i))
	}
}
