package llm

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/synth"
)

// tinyArch writes a small model of a synth architecture (a Preset name): 260K's width, the
// given layers, and a sliding window of window tokens where the architecture has one.
func tinyArch(t testing.TB, variant string, layers, window int) *Model {
	t.Helper()
	s, err := synth.Preset(variant, "260K", core.F32, 7)
	require.NoError(t, err)
	s.Layers, s.Context = layers, 64
	if s.Window > 0 {
		s.Window = window
	}
	f, err := synth.Parse(s)
	require.NoError(t, err)
	m, err := FromFile(f)
	require.NoError(t, err)
	return m
}

// refModel is an independent float64 forward pass of a model file, written from llama.cpp's
// graphs (llm_build_llama, _qwen3, _phi3, _gemma2, _gemma3) rather than from the builders: it
// reads the tensors and the architecture's keys from the file itself.
type refModel struct {
	t                   *testing.T
	f                   *gguf.File
	arch                string
	dim, heads, kvHeads int
	hd, rot, ffn, vocab int
	layers              int
	eps, base           float64
	window              int
	softcap, finalCap   float64
	embScale, attnScale float64   // 0: none, 1/√head_dim
	resScale, logitDiv  float64   // Granite's multipliers (0: none)
	factors             []float64 // RoPE frequency divisors (nil: none)
	mscale              float64
	// k and v rows of every layer so far
	k, v [][][]float64
}

func newRefModel(t *testing.T, f *gguf.File, ctxLen int) *refModel {
	t.Helper()
	arch := str(t, f, "general.architecture")
	num := func(key string, def int) int {
		v, ok := f.Get(arch + "." + key)
		if !ok {
			return def
		}
		n, _ := v.Int()
		return int(n)
	}
	flt := func(key string, def float64) float64 {
		v, ok := f.Get(arch + "." + key)
		if !ok {
			return def
		}
		x, _ := v.Float()
		return x
	}
	r := &refModel{t: t, f: f, arch: arch, dim: num("embedding_length", 0), heads: num("attention.head_count", 0),
		kvHeads: num("attention.head_count_kv", 0), ffn: num("feed_forward_length", 0), layers: num("block_count", 0),
		eps: flt("attention.layer_norm_rms_epsilon", 1e-5), base: flt("rope.freq_base", 10000),
		window: num("attention.sliding_window", 0), mscale: 1}
	r.hd = num("attention.key_length", r.dim/r.heads)
	r.rot = num("rope.dimension_count", r.hd)
	emb, _ := f.Tensor("token_embd.weight")
	r.vocab = int(emb.Shape[0])
	if arch == "gemma2" {
		r.softcap, r.finalCap = flt("attn_logit_softcapping", 0), flt("final_logit_softcapping", 0)
	}
	if arch == "gemma2" || arch == "gemma3" {
		r.embScale = math.Sqrt(float64(r.dim))
	}
	if arch == "granite" {
		r.embScale, r.attnScale = flt("embedding_scale", 0), flt("attention.scale", 0)
		r.resScale, r.logitDiv = flt("residual_scale", 0), flt("logit_scale", 0)
	}
	if _, ok := f.Tensor("rope_freqs.weight"); ok {
		r.factors = r.vec("rope_freqs.weight")
	}
	if arch == "phi3" {
		name := "rope_factors_short.weight"
		if ctxLen > num("rope.scaling.original_context_length", 0) {
			name = "rope_factors_long.weight"
		}
		r.factors = r.vec(name)[:r.rot/2]
		r.mscale = flt("rope.scaling.attn_factor", 1)
	}
	r.k, r.v = make([][][]float64, r.layers), make([][][]float64, r.layers)
	return r
}

func str(t *testing.T, f *gguf.File, key string) string {
	v, ok := f.Get(key)
	require.True(t, ok, key)
	s, _ := v.Str()
	return s
}

// vec reads a tensor as float64s.
func (r *refModel) vec(name string) []float64 {
	ti, ok := r.f.Tensor(name)
	require.True(r.t, ok, name)
	xs, err := core.Dequantize(ti.DType, r.f.TensorData(ti), 0)
	require.NoError(r.t, err)
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

// matvec is W x for W [n, len(x)] rows rows0..rows0+n of the tensor.
func (r *refModel) matvec(name string, x []float64, row0, n int) []float64 {
	w := r.vec(name)
	k := len(x)
	out := make([]float64, n)
	for i := range out {
		var s float64
		for j, xj := range x {
			s += w[(row0+i)*k+j] * xj
		}
		out[i] = s
	}
	return out
}

func (r *refModel) rmsNorm(x, w []float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+r.eps)
	out := make([]float64, len(x))
	for i := range x {
		out[i] = x[i] * inv * w[i]
	}
	return out
}

func (r *refModel) has(name string) bool { _, ok := r.f.Tensor(name); return ok }

// sliding and RopeOf are the layer patterns of llama.cpp's graphs.
func (r *refModel) sliding(l int) bool {
	switch r.arch {
	case "gemma2":
		return l%2 == 0
	case "gemma3":
		return (l+1)%6 != 0
	}
	return r.window > 0
}

// rope rotates one head at position p in place.
func (r *refModel) rope(x []float64, p, l int) {
	base := r.base
	if r.arch == "gemma3" && r.sliding(l) {
		base = 10000
	}
	if r.arch == "smollm3" && (l+1)%4 == 0 {
		return // SmolLM3's NoPE layers
	}
	neox := r.arch != "llama" && r.arch != "smollm3" && r.arch != "granite"
	for i := 0; i < r.rot/2; i++ {
		theta := float64(p) * math.Pow(base, -2*float64(i)/float64(r.rot))
		if r.factors != nil {
			theta /= r.factors[i]
		}
		c, s := math.Cos(theta)*r.mscale, math.Sin(theta)*r.mscale
		a, b := 2*i, 2*i+1
		if neox {
			a, b = i, i+r.rot/2
		}
		x[a], x[b] = x[a]*c-x[b]*s, x[a]*s+x[b]*c
	}
}

// step runs token id at position p (positions in order from 0) and returns its logits.
func (r *refModel) step(id, p int) []float64 {
	D, HD := r.dim, r.hd
	gemma := r.arch == "gemma2" || r.arch == "gemma3"
	x := r.vec("token_embd.weight")[id*D : (id+1)*D]
	x = append([]float64(nil), x...)
	if r.embScale != 0 {
		for i := range x {
			x[i] *= r.embScale
		}
	}
	for l := 0; l < r.layers; l++ {
		pre := fmt.Sprintf("blk.%d.", l)
		h := r.rmsNorm(x, r.vec(pre+"attn_norm.weight"))
		Q, KV := r.heads*HD, r.kvHeads*HD
		var q, k, v []float64
		if r.has(pre + "attn_qkv.weight") {
			q, k, v = r.matvec(pre+"attn_qkv.weight", h, 0, Q), r.matvec(pre+"attn_qkv.weight", h, Q, KV),
				r.matvec(pre+"attn_qkv.weight", h, Q+KV, KV)
		} else {
			q, k, v = r.matvec(pre+"attn_q.weight", h, 0, Q), r.matvec(pre+"attn_k.weight", h, 0, KV),
				r.matvec(pre+"attn_v.weight", h, 0, KV)
		}
		if r.has(pre + "attn_q.bias") {
			for i, b := range r.vec(pre + "attn_q.bias") {
				q[i] += b
			}
			for i, b := range r.vec(pre + "attn_k.bias") {
				k[i] += b
			}
			for i, b := range r.vec(pre + "attn_v.bias") {
				v[i] += b
			}
		}
		for hh := 0; hh < r.heads; hh++ {
			head := q[hh*HD : (hh+1)*HD]
			if r.has(pre + "attn_q_norm.weight") {
				copy(head, r.rmsNorm(head, r.vec(pre+"attn_q_norm.weight")))
			}
			r.rope(head, p, l)
		}
		for hh := 0; hh < r.kvHeads; hh++ {
			head := k[hh*HD : (hh+1)*HD]
			if r.has(pre + "attn_k_norm.weight") {
				copy(head, r.rmsNorm(head, r.vec(pre+"attn_k_norm.weight")))
			}
			r.rope(head, p, l)
		}
		r.k[l], r.v[l] = append(r.k[l], k), append(r.v[l], v)
		att := make([]float64, Q)
		scale := 1 / math.Sqrt(float64(HD))
		if r.attnScale != 0 {
			scale = r.attnScale
		}
		for hh := 0; hh < r.heads; hh++ {
			kvh := hh / (r.heads / r.kvHeads)
			qh := q[hh*HD : (hh+1)*HD]
			first := 0
			if r.sliding(l) && r.window > 0 {
				first = max(0, p-r.window+1) // llama.cpp masks pos_q - pos_k >= n_swa
			}
			scores := make([]float64, p+1)
			mx := math.Inf(-1)
			for j := first; j <= p; j++ {
				var s float64
				for d := 0; d < HD; d++ {
					s += qh[d] * r.k[l][j][kvh*HD+d]
				}
				s *= scale
				if r.softcap > 0 {
					s = r.softcap * math.Tanh(s/r.softcap)
				}
				scores[j] = s
				mx = math.Max(mx, s)
			}
			var sum float64
			for j := first; j <= p; j++ {
				scores[j] = math.Exp(scores[j] - mx)
				sum += scores[j]
			}
			for j := first; j <= p; j++ {
				for d := 0; d < HD; d++ {
					att[hh*HD+d] += scores[j] / sum * r.v[l][j][kvh*HD+d]
				}
			}
		}
		o := r.matvec(pre+"attn_output.weight", att, 0, D)
		if gemma {
			o = r.rmsNorm(o, r.vec(pre+"post_attention_norm.weight"))
		}
		if r.resScale != 0 {
			for i := range o {
				o[i] *= r.resScale
			}
		}
		for i := range x {
			x[i] += o[i]
		}
		h = r.rmsNorm(x, r.vec(pre+"ffn_norm.weight"))
		var gate, up []float64
		if r.arch == "phi3" {
			gate, up = r.matvec(pre+"ffn_up.weight", h, 0, r.ffn), r.matvec(pre+"ffn_up.weight", h, r.ffn, r.ffn)
		} else {
			gate, up = r.matvec(pre+"ffn_gate.weight", h, 0, r.ffn), r.matvec(pre+"ffn_up.weight", h, 0, r.ffn)
		}
		for i, g := range gate {
			if gemma {
				g = 0.5 * g * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(g+0.044715*g*g*g)))
			} else {
				g /= 1 + math.Exp(-g)
			}
			gate[i] = g * up[i]
		}
		d := r.matvec(pre+"ffn_down.weight", gate, 0, D)
		if gemma {
			d = r.rmsNorm(d, r.vec(pre+"post_ffw_norm.weight"))
		}
		if r.resScale != 0 {
			for i := range d {
				d[i] *= r.resScale
			}
		}
		for i := range x {
			x[i] += d[i]
		}
	}
	h := r.rmsNorm(x, r.vec("output_norm.weight"))
	head := "output.weight"
	if !r.has(head) {
		head = "token_embd.weight"
	}
	logits := r.matvec(head, h, 0, r.vocab)
	if r.logitDiv != 0 {
		for i := range logits {
			logits[i] /= r.logitDiv
		}
	}
	if r.finalCap > 0 {
		for i, z := range logits {
			logits[i] = r.finalCap * math.Tanh(z/r.finalCap)
		}
	}
	return logits
}

// TestArchLogitsMatchAnIndependentForward runs every architecture's stage graphs on the
// reference backend, prefill in chunks that cross the sliding window and then decode, and
// compares the logits of every position with refModel's.
func TestArchLogitsMatchAnIndependentForward(t *testing.T) {
	for _, c := range []struct {
		variant string
		layers  int
		ctx     int
	}{
		{"llama", 2, 32}, {"llama3", 2, 32}, {"mistral", 2, 32}, {"qwen2", 2, 32}, {"qwen3", 2, 32},
		{"phi3", 2, 32}, // context within the original: the short factors
		{"phi3", 2, 48}, // beyond it: the long ones
		{"gemma2", 2, 32}, {"gemma3", 7, 32}, {"smollm3", 5, 32}, {"granite", 2, 32},
	} {
		t.Run(fmt.Sprintf("%s-ctx%d", c.variant, c.ctx), func(t *testing.T) {
			m := tinyArch(t, c.variant, c.layers, 5)
			ref := newRefModel(t, m.File, c.ctx)
			// an F32 cache: the bound is the float64 forward's, not f16 rounding's
			r, err := NewRunner(context.Background(), m, refDevice(t), WithChunkSize(4), WithContextLength(c.ctx),
				WithKVCacheType(core.F32))
			require.NoError(t, err)
			defer r.Close()
			ids := m.Tokenizer.Encode("the cat sat on a mat", true)
			require.Greater(t, len(ids), 6, "the prompt crosses the window of 5")
			want := func(p int, id int32) []float64 { return ref.step(int(id), p) }
			check := func(p int, got []float32, want []float64) {
				require.Len(t, got, len(want))
				var num, den float64
				for i := range want {
					d := float64(got[i]) - want[i]
					num += d * d
					den += want[i] * want[i]
				}
				require.Less(t, num/den, 1e-9, "position %d: NMSE", p)
			}
			_, err = r.PrefillEach(context.Background(), ids, func(i int, logits []float32) error {
				check(i, logits, want(i, ids[i]))
				return nil
			})
			require.NoError(t, err)
			for p, id := len(ids), int32(300); p < len(ids)+4; p, id = p+1, id+7 {
				got, err := r.Decode(context.Background(), id)
				require.NoError(t, err)
				check(p, got, want(p, id))
			}
		})
	}
}

// Each architecture's keys land in the config the shared blocks read.
func TestArchConfig(t *testing.T) {
	attn := float32(math.Sqrt(1 + math.Log(2)/math.Log(256)))
	for _, c := range []struct {
		variant string
		check   func(t *testing.T, c Config)
	}{
		{"llama3", func(t *testing.T, c Config) {
			assert.Equal(t, int64(core.RoPENormal), c.RopeMode)
			assert.Equal(t, float32(500000), c.RopeBase)
			require.Len(t, c.RopeFreqFactors, 4)
			assert.Equal(t, float32(8), c.RopeFreqFactors[3], "the lowest frequency is scaled by 8")
		}},
		{"mistral", func(t *testing.T, c Config) {
			assert.Equal(t, 128, c.SlidingWindow)
			assert.True(t, c.Sliding(0) && c.Sliding(4), "every layer slides")
		}},
		{"qwen3", func(t *testing.T, c Config) {
			assert.True(t, c.QKNorm)
			assert.False(t, c.QKVBias)
			assert.Equal(t, int64(core.RoPENeoX), c.RopeMode)
			assert.Equal(t, 16, c.HeadDim, "attention.key_length: twice dim/heads")
		}},
		{"phi3", func(t *testing.T, c Config) {
			assert.Equal(t, 6, c.RopeDims, "partial rotary")
			assert.Equal(t, 256, c.RopeOrigContext)
			assert.InDelta(t, attn, c.RopeAttnFactor, 1e-6)
			assert.Len(t, c.RopeFreqFactors, 3)
			assert.Len(t, c.RopeFactorsLong, 3)
			assert.Equal(t, 128, c.SlidingWindow)
		}},
		{"granite", func(t *testing.T, c Config) {
			assert.Equal(t, [4]float32{12, 0.125, 0.22, 8}, [4]float32{c.EmbedScale, c.AttnScale, c.ResidualScale, c.LogitScale})
		}},
		{"gemma2", func(t *testing.T, c Config) {
			assert.Equal(t, float32(8), c.EmbedScale, "√64")
			assert.Equal(t, arch.ActGELU, c.Activation)
			assert.Equal(t, float32(50), c.AttnSoftCap)
			assert.Equal(t, float32(30), c.FinalSoftCap)
			assert.True(t, c.Sliding(0))
			assert.False(t, c.Sliding(1))
			assert.Equal(t, float32(1/math.Sqrt(8)), c.AttnScale)
		}},
		{"gemma3", func(t *testing.T, c Config) {
			assert.True(t, c.QKNorm)
			assert.Zero(t, c.AttnSoftCap)
			assert.Equal(t, []bool{true, true, true, true, true, false}, []bool{c.Sliding(0), c.Sliding(1),
				c.Sliding(2), c.Sliding(3), c.Sliding(4), c.Sliding(5)})
			base, scale := c.RopeOf(0)
			assert.Equal(t, [2]float32{10000, 1}, [2]float32{base, scale}, "local layers")
			base, _ = c.RopeOf(5)
			assert.Equal(t, float32(1000000), base, "global layers")
		}},
	} {
		t.Run(c.variant, func(t *testing.T) {
			m, err := FromFile(rewriteArch(t, c.variant, nil, nil))
			require.NoError(t, err)
			c.check(t, m.Config)
		})
	}
}

// A bad or missing key or tensor of an architecture is an error that names it.
func TestArchLoadErrorsNameTheProblem(t *testing.T) {
	drop := func(name string) func([]gguf.WriteTensor) []gguf.WriteTensor {
		return func(ts []gguf.WriteTensor) []gguf.WriteTensor {
			var out []gguf.WriteTensor
			for _, x := range ts {
				if x.Name != name {
					out = append(out, x)
				}
			}
			return out
		}
	}
	dropKV := func(key string) func([]gguf.KeyValue) []gguf.KeyValue {
		return func(kvs []gguf.KeyValue) []gguf.KeyValue {
			var out []gguf.KeyValue
			for _, kv := range kvs {
				if kv.Key != key {
					out = append(out, kv)
				}
			}
			return out
		}
	}
	reshape := func(name string, shape core.Shape) func([]gguf.WriteTensor) []gguf.WriteTensor {
		return func(ts []gguf.WriteTensor) []gguf.WriteTensor {
			for i := range ts {
				if ts[i].Name == name {
					ts[i].Shape, ts[i].Data = shape, make([]byte, 4*shape.NumElements())
				}
			}
			return ts
		}
	}
	for _, c := range []struct {
		name, variant string
		kv            func([]gguf.KeyValue) []gguf.KeyValue
		ts            func([]gguf.WriteTensor) []gguf.WriteTensor
		target        error
		msg           string
	}{
		{"unknown architecture", "llama", setKV("general.architecture", "mamba"), nil, core.ErrUnsupported, "gemma2, gemma3, granite, llama, phi3, qwen2, qwen3, smollm3"},
		{"gemma3 window", "gemma3", dropKV("gemma3.attention.sliding_window"), nil, core.ErrInvalidArgument, "missing gemma3.attention.sliding_window"},
		{"gemma2 soft-cap", "gemma2", setKV("gemma2.attn_logit_softcapping", float32(math.NaN())), nil, core.ErrInvalidArgument, "gemma2.attn_logit_softcapping"},
		{"gemma2 final soft-cap", "gemma2", setKV("gemma2.final_logit_softcapping", float32(-1)), nil, core.ErrInvalidArgument, "gemma2.final_logit_softcapping"},
		{"phi3 attention factor", "phi3", setKV("phi3.rope.scaling.attn_factor", float32(0)), nil, core.ErrInvalidArgument, "phi3.rope.scaling.attn_factor"},
		{"phi3 window", "phi3", setKV("phi3.attention.sliding_window", "wide"), nil, core.ErrInvalidArgument, "phi3.attention.sliding_window"},
		{"value length", "qwen3", setKV("qwen3.attention.value_length", uint32(8)), nil, core.ErrUnsupported, "qwen3.attention.value_length 8"},
		{"key length", "qwen3", setKV("qwen3.attention.key_length", "x"), nil, core.ErrInvalidArgument, "qwen3.attention.key_length"},
		{"q norm", "qwen3", nil, drop("blk.1.attn_q_norm.weight"), core.ErrNotFound, "blk.1.attn_q_norm.weight"},
		{"post norm", "gemma3", nil, drop("blk.0.post_ffw_norm.weight"), core.ErrNotFound, "blk.0.post_ffw_norm.weight"},
		{"fused qkv", "phi3", nil, reshape("blk.0.attn_qkv.weight", core.Shape{64, 64}), core.ErrInvalidArgument, "blk.0.attn_qkv.weight"},
		{"granite scale", "granite", dropKV("granite.residual_scale"), nil, core.ErrInvalidArgument, "missing granite.residual_scale"},
		{"granite logit scale", "granite", setKV("granite.logit_scale", float32(0)), nil, core.ErrInvalidArgument, "granite.logit_scale"},
		{"long factors", "phi3", nil, reshape("rope_factors_long.weight", core.Shape{2}), core.ErrInvalidArgument, "rope_factors_long.weight"},
		{"short factors", "phi3", nil, reshape("rope_factors_short.weight", core.Shape{4}), core.ErrInvalidArgument, "rope_factors_short.weight[0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := FromFile(rewriteArch(t, c.variant, c.kv, c.ts))
			require.ErrorIs(t, err, c.target)
			assert.Contains(t, err.Error(), c.msg)
		})
	}
}

// Decode shards, the sparse FFN, W8A8 and calibration build Llama's layers themselves: other
// architectures, and Llama with a sliding window, are refused rather than run wrong.
func TestTechniquesNeedLlamaShape(t *testing.T) {
	for variant, ok := range map[string]bool{"llama": true, "llama3": true, "qwen2": true, "mistral": false,
		"qwen3": false, "phi3": false, "gemma2": false, "gemma3": false, "smollm3": false, "granite": false} {
		t.Run(variant, func(t *testing.T) {
			m, err := FromFile(rewriteArch(t, variant, nil, nil))
			require.NoError(t, err)
			err = m.RequireLlamaShape("decode shards")
			if ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrArchFeature)
			require.ErrorIs(t, err, core.ErrUnsupported)
			assert.Contains(t, err.Error(), "decode shards on "+m.Config.Arch)
		})
	}
}

// Every architecture runs on the neon plugin with the reference backend's logits: windows
// that hide keys (window 5 over a longer prompt) and Gemma 2's soft-caps included, which
// need neon's op set 5.
func TestArchOnNeonMatchesRef(t *testing.T) {
	neon := pluginDevices(t, "neon")[0]
	for _, c := range []struct {
		variant        string
		layers, window int
	}{
		{"llama3", 2, 0}, {"qwen3", 2, 0}, {"smollm3", 4, 0}, {"granite", 2, 0}, {"phi3", 2, 64}, {"gemma3", 7, 64},
		{"mistral", 2, 5}, {"phi3", 2, 5}, {"gemma3", 7, 5}, {"gemma2", 2, 5},
	} {
		t.Run(fmt.Sprintf("%s-window%d", c.variant, c.window), func(t *testing.T) {
			m := tinyArch(t, c.variant, c.layers, c.window)
			ids := m.Tokenizer.Encode("the cat sat on a mat", true)
			logits := func(d core.Device) []float32 {
				r, err := NewRunner(context.Background(), m, d, WithChunkSize(4), WithContextLength(32))
				require.NoError(t, err)
				defer r.Close()
				var all []float32
				_, err = r.PrefillEach(context.Background(), ids, func(_ int, l []float32) error {
					all = append(all, l...)
					return nil
				})
				require.NoError(t, err)
				return all
			}
			want, got := logits(refDevice(t)), logits(neon)
			var num, den float64
			for i := range want {
				d := float64(got[i] - want[i])
				num, den = num+d*d, den+float64(want[i])*float64(want[i])
			}
			assert.Less(t, num/den, 1e-6, "NMSE of neon's logits")
		})
	}
}
