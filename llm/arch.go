package llm

import (
	"fmt"
	"math"
	"sort"

	"github.com/xpuhub/xpu/core"
)

// archBuilder builds what one architecture's stage graphs differ in. graph.go keeps the stage
// structure every architecture shares (stage 0: embedding and layer 0's q, k, v; stage l+1:
// attention and the rest of layer l, then layer l+1's q, k, v or the logits), which the runner,
// plans, decode shards and speculative decoding rely on. Each builder is made of the shared
// blocks below, as llama.cpp's llm_build_* functions are made of llm_build_norm,
// llm_build_ffn...: no architecture is named outside its own builder.
type archBuilder interface {
	// config reads the architecture's own metadata into c, after the common keys.
	config(k *keys, c *Config) error
	// tensors lists layer l's tensors and the shapes they must have.
	tensors(c *Config, l int) []tensorSpec
	// load reads the global tensors that complete the config (RoPE factors) from m.File.
	load(m *Model) error
	// embed turns the embedding rows x [C, dim] into layer 0's input.
	embed(b block, x *core.Tensor) *core.Tensor
	// qkv computes layer l's rotated queries [C, H, D] and keys [C, Hkv, D] and its values
	// [C, Hkv, D] from the layer's input x.
	qkv(b block, x *core.Tensor, pos posInputs, l int) (q, k, v *core.Tensor)
	// finish computes layer l's output from its input x and its attention output a [C, H·D].
	finish(b block, x, a *core.Tensor, l int) *core.Tensor
	// logits computes the output head over the last layer's output x.
	logits(b block, x *core.Tensor) *core.Tensor
	// plain reports Llama's layer shape (separate q, k, v, SwiGLU, no extra norms), which the
	// sharded decode, the sparse FFN, W8A8 weights and calibration taps build by themselves.
	plain() bool
}

// archs maps general.architecture to its builder. Mistral's GGUFs say "llama".
var archs = map[string]archBuilder{
	"llama":  llamaArch{rope: core.RoPENormal, window: true},
	"qwen2":  llamaArch{rope: core.RoPENeoX, bias: true},
	"qwen3":  qwen3Arch{},
	"phi3":   phi3Arch{},
	"gemma2": gemmaArch{version: 2},
	"gemma3": gemmaArch{version: 3},
	// SmolLM3: Llama with no RoPE in every fourth layer
	"smollm3": llamaArch{rope: core.RoPENormal, noRopeStep: 4},
	"granite": graniteArch{llamaArch{rope: core.RoPENormal}},
}

// Architectures lists the general.architecture values xpu loads, sorted.
func Architectures() []string {
	names := make([]string, 0, len(archs))
	for n := range archs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ErrArchFeature: a technique (decode shards, the sparse FFN, W8A8 weights) builds Llama-shaped
// layers itself and the model's architecture is not.
var ErrArchFeature = fmt.Errorf("llm: the technique builds Llama-shaped layers: %w", core.ErrUnsupported)

// RequireLlamaShape refuses, with ErrArchFeature, a technique that builds its own Llama-shaped
// layers (named by technique) for a model whose layers are not.
func (m *Model) RequireLlamaShape(technique string) error {
	if m.arch.plain() && m.Config.SlidingWindow == 0 && m.Config.HeadDim*m.Config.Heads == m.Config.Dim {
		return nil
	}
	return fmt.Errorf("%w: %s on %s", ErrArchFeature, technique, m.Config.Arch)
}

// tensorSpec is a tensor a model reads and the shape it must have.
type tensorSpec struct {
	name     string
	shape    core.Shape
	optional bool
	vector   bool // a norm weight or bias: used as an f32 operand of ADD/MUL
}

// block is the graph a builder adds to and its build state: what the shared blocks take.
type block struct {
	m  *Model
	g  *core.Graph
	sb *stageBuild
}

// layerName is the name of a tensor of layer l.
func layerName(l int, name string) string { return fmt.Sprintf("blk.%d.%s", l, name) }

// norm is RMSNorm times the weight.
func (b block) norm(x *core.Tensor, weight string) *core.Tensor { return b.m.norm(b.g, x, weight) }

// linear is x times layer l's matrix name (node named name; W8A8 and taps apply).
func (b block) linear(x *core.Tensor, l int, name string) *core.Tensor {
	return b.m.linear(b.g, b.sb, x, l, name)
}

// heads views t [C, n·D] as n heads [C, n, D].
func (b block) heads(t *core.Tensor, n int) *core.Tensor {
	return b.g.Reshape(t, t.Shape[0], int64(n), int64(b.m.Config.HeadDim))
}

// normAs is RMSNorm over the last axis times the weight, its MUL named name: Gemma's
// post-norms, and the per-head norms of q or k [C, H, D] with a [D] weight (Qwen3, Gemma 3).
func (b block) normAs(name string, x *core.Tensor, weight string) *core.Tensor {
	n := b.g.RMSNorm(x, b.m.Config.NormEps)
	return b.g.Named(name).Mul(n, b.m.w(b.g, weight))
}

// projectQKV is the separate Q, K and V projections of layer l's normed input h, with their
// biases when the config has them, as heads.
func (b block) projectQKV(h *core.Tensor, l int) (q, k, v *core.Tensor) {
	c := b.m.Config
	proj := func(name string, heads int) *core.Tensor {
		t := b.linear(h, l, name)
		if c.QKVBias {
			t = b.g.Add(t, b.m.w(b.g, layerName(l, name+".bias")))
		}
		return b.heads(t, heads)
	}
	return proj("attn_q", c.Heads), proj("attn_k", c.KVHeads), proj("attn_v", c.KVHeads)
}

// ropeQK rotates layer l's queries and keys (unless the layer has no RoPE).
func (b block) ropeQK(q, k *core.Tensor, pos posInputs, l int) (*core.Tensor, *core.Tensor) {
	if !b.m.Config.Rotates(l) {
		return q, k
	}
	return b.m.rope(b.g, "q_rope", q, pos, l), b.m.rope(b.g, "k_rope", k, pos, l)
}

// attnResidual adds layer l's attention output projection of a (post-normed when postNorm)
// to x.
func (b block) attnResidual(x, a *core.Tensor, l int, postNorm bool) *core.Tensor {
	o := b.linear(a, l, "attn_output")
	if postNorm {
		o = b.normAs("attn_post_norm", o, layerName(l, "post_attention_norm.weight"))
	}
	return b.g.Named("attn_residual").Add(x, o)
}

// gatedFFN is the gated feed-forward block of layer l on x's ffn_norm: act(gate)·up, then the
// down projection.
func (b block) gatedFFN(x *core.Tensor, l int) *core.Tensor {
	h := b.norm(x, layerName(l, "ffn_norm.weight"))
	gate, up := b.linear(h, l, "ffn_gate"), b.linear(h, l, "ffn_up")
	name := "ffn_swiglu"
	if b.m.Config.Activation == ActGELU {
		name = "ffn_geglu"
	}
	act := b.m.activation(b.g, gate)
	f := b.g.Named(name).Mul(act, up)
	return b.linear(f, l, "ffn_down")
}

// head is the final norm and the output projection.
func (b block) head(x *core.Tensor) *core.Tensor {
	b.g.SetNamePrefix("")
	h := b.norm(x, "output_norm.weight")
	return b.g.Named("logits").MatMul(h, b.m.w(b.g, "output.weight"))
}

// attentionOptions are layer l's ATTENTION options from the config over a cache of capacity
// rows: the query scale, the score soft-cap and the sliding window, which is left out where it
// hides nothing (no position in the cache is as far as the window from another). The stage
// adds causality, the query offset and a tree mask.
func (c Config) attentionOptions(l int, capacity int64) core.AttentionOptions {
	o := core.AttentionOptions{Scale: c.AttnScale, SoftCap: c.AttnSoftCap}
	if o.Scale == 0 {
		o.Scale = float32(1 / math.Sqrt(float64(c.HeadDim)))
	}
	if c.Sliding(l) && int64(c.SlidingWindow) < capacity {
		o.Window = int64(c.SlidingWindow)
	}
	return o
}

// softCap is c·tanh(x/c) (Gemma 2's final logits).
func (b block) softCap(name string, x *core.Tensor, c float32) *core.Tensor {
	th := b.g.Tanh(b.g.Scale(x, 1/c, 0))
	return b.g.Named(name).Scale(th, c, 0)
}

// qkvSpecs are the separate projections' tensors of layer l (with biases when the config has
// them).
func qkvSpecs(c *Config, l int) []tensorSpec {
	D, q, kv := int64(c.Dim), int64(c.Heads*c.HeadDim), int64(c.KVHeads*c.HeadDim)
	s := []tensorSpec{
		{name: layerName(l, "attn_q.weight"), shape: core.Shape{q, D}},
		{name: layerName(l, "attn_k.weight"), shape: core.Shape{kv, D}},
		{name: layerName(l, "attn_v.weight"), shape: core.Shape{kv, D}},
	}
	if c.QKVBias {
		s = append(s,
			tensorSpec{name: layerName(l, "attn_q.bias"), shape: core.Shape{q}, vector: true},
			tensorSpec{name: layerName(l, "attn_k.bias"), shape: core.Shape{kv}, vector: true},
			tensorSpec{name: layerName(l, "attn_v.bias"), shape: core.Shape{kv}, vector: true})
	}
	return s
}

// layerSpecs are the tensors every layer has besides its Q, K, V projections: the norms, the
// output projection and the FFN (gate separate unless fused).
func layerSpecs(c *Config, l int, fusedFFN bool) []tensorSpec {
	D, F := int64(c.Dim), int64(c.FFN)
	s := []tensorSpec{
		{name: layerName(l, "attn_norm.weight"), shape: core.Shape{D}, vector: true},
		{name: layerName(l, "attn_output.weight"), shape: core.Shape{D, int64(c.Heads * c.HeadDim)}},
		{name: layerName(l, "ffn_norm.weight"), shape: core.Shape{D}, vector: true},
		{name: layerName(l, "ffn_down.weight"), shape: core.Shape{D, F}},
	}
	if fusedFFN {
		return append(s, tensorSpec{name: layerName(l, "ffn_up.weight"), shape: core.Shape{2 * F, D}})
	}
	return append(s,
		tensorSpec{name: layerName(l, "ffn_gate.weight"), shape: core.Shape{F, D}},
		tensorSpec{name: layerName(l, "ffn_up.weight"), shape: core.Shape{F, D}})
}

// headNormSpecs are the per-head norms of q and k.
func headNormSpecs(c *Config, l int) []tensorSpec {
	D := core.Shape{int64(c.HeadDim)}
	return []tensorSpec{
		{name: layerName(l, "attn_q_norm.weight"), shape: D, vector: true},
		{name: layerName(l, "attn_k_norm.weight"), shape: D, vector: true},
	}
}

// ropeFactors reads a RoPE frequency factor tensor: nil when absent; it must hold RopeDims/2
// positive factors, or HeadDim/2 of which the first RopeDims/2 count (llama.cpp declares
// phi3's factors per head dim even with partial rotary).
func (m *Model) ropeFactors(name string) ([]float32, error) {
	c := m.Config
	t, ok := m.File.Tensor(name)
	if !ok {
		return nil, nil
	}
	want := core.Shape{int64(c.RopeDims / 2)}
	if !t.Shape.Equal(want) && !t.Shape.Equal(core.Shape{int64(c.HeadDim / 2)}) {
		return nil, fmt.Errorf("llm: tensor %s is %s, want %s: %w", name, t.Shape, want, core.ErrInvalidArgument)
	}
	f, err := core.Dequantize(t.DType, m.File.TensorData(t), 0)
	if err != nil {
		return nil, fmt.Errorf("llm: tensor %s: %w", name, err)
	}
	f = f[:c.RopeDims/2]
	for i, x := range f {
		if !(x > 0) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("llm: %s[%d] = %g must be positive: %w", name, i, x, core.ErrInvalidArgument)
		}
	}
	return f, nil
}
