// Package arch builds a decoder-only model's stage graphs: the stage structure every
// architecture shares (Stage), and what each supported architecture's layers differ in, from
// the hyperparameters its GGUF metadata gives (Config), one small builder per architecture over
// shared blocks.
package arch

import (
	"fmt"
	"math"
	"sort"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
)

// Builder builds what one architecture's stage graphs differ in. Stage (stage.go) builds the
// stage structure every architecture shares (stage 0: embedding and layer 0's q, k, v; stage
// l+1: attention and the rest of layer l, then layer l+1's q, k, v or the logits), which the
// runner, plans, decode shards and speculative decoding rely on. Each builder is made of the
// shared blocks below, as llama.cpp's llm_build_* functions are made of llm_build_norm,
// llm_build_ffn...: no architecture is named outside its own builder. Only this package
// implements it.
type Builder interface {
	// config reads the architecture's own metadata into c, after the common keys.
	config(k *keys, c *Config) error
	// Tensors lists layer l's tensors and the shapes they must have.
	Tensors(c *Config, l int) []TensorSpec
	// Load reads the global tensors that complete the config (RoPE factors) and splits fused
	// weights.
	Load(ld Loader) error
	// Embed turns the embedding rows x [C, dim] into layer 0's input.
	Embed(b Block, x *core.Tensor) *core.Tensor
	// QKV computes layer l's rotated queries [C, H, D] and keys [C, Hkv, D] and its values
	// [C, Hkv, D] from the layer's input x.
	QKV(b Block, x *core.Tensor, pos Pos, l int) (q, k, v *core.Tensor)
	// Finish computes layer l's output from its input x and its attention output a [C, H·D].
	Finish(b Block, x, a *core.Tensor, l int) *core.Tensor
	// Logits computes the output head over the last layer's output x.
	Logits(b Block, x *core.Tensor) *core.Tensor
	// Plain reports Llama's layer shape (separate q, k, v, SwiGLU, no extra norms), which the
	// sharded decode, the sparse FFN, W8A8 weights and calibration taps build by themselves.
	Plain() bool
}

// archs maps general.architecture to its builder. Mistral's GGUFs say "llama".
var archs = map[string]Builder{
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

// Lookup returns the builder of general.architecture name.
func Lookup(name string) (Builder, bool) {
	b, ok := archs[name]
	return b, ok
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

// Host gives the shared blocks the model's weights: a weight as a graph constant, and a
// linear layer (which W8A8 lowering and calibration taps may replace).
type Host interface {
	// Weight adds the model's tensor name to g.
	Weight(g *core.Graph, name string) *core.Tensor
	// Linear is x times layer l's matrix name, its node named name.
	Linear(g *core.Graph, x *core.Tensor, l int, name string) *core.Tensor
}

// Loader is what a builder's Load completes: the file's global tensors, the config they
// complete and the split of a fused weight into row ranges named after layer l's parts.
type Loader struct {
	File      *gguf.File
	Config    *Config
	SplitRows func(name string, parts []string, l int, rows ...int64) error
}

// TensorSpec is a tensor a model reads and the shape it must have.
type TensorSpec struct {
	Name     string
	Shape    core.Shape
	Optional bool
	Vector   bool // a norm weight or bias: used as an f32 operand of ADD/MUL
}

// Block is the graph a builder adds to, the config, the architecture's builder and the
// weights' host: what the shared blocks take, and what a technique that cuts the model's stages
// its own way (a sparse FFN, decode shards, a batch) builds the model's pieces with.
type Block struct {
	g *core.Graph
	c *Config
	a Builder
	h Host
}

// NewBlock is a block adding to g for the model of config c, architecture a, whose weights h
// gives.
func NewBlock(g *core.Graph, c *Config, a Builder, h Host) Block {
	return Block{g: g, c: c, a: a, h: h}
}

// Embed adds the token embedding of ids [C]: layer 0's input.
func (b Block) Embed(ids *core.Tensor) *core.Tensor {
	return b.a.Embed(b, b.g.Named("embd").GetRows(b.h.Weight(b.g, "token_embd.weight"), ids))
}

// QKV adds layer l's rotated queries and keys and its values for x [C, dim] (Builder.QKV).
func (b Block) QKV(x *core.Tensor, pos Pos, l int) (q, k, v *core.Tensor) {
	return b.a.QKV(b, x, pos, l)
}

// Finish adds layer l's output from its input x [C, dim] and its attention output a [C, H·D]:
// the attention output projection and the FFN, with their norms and residuals.
func (b Block) Finish(x, a *core.Tensor, l int) *core.Tensor { return b.a.Finish(b, x, a, l) }

// Logits adds the output head over the last layer's output x.
func (b Block) Logits(x *core.Tensor) *core.Tensor { return b.a.Logits(b, x) }

// LayerName is the name of a tensor of layer l.
func LayerName(l int, name string) string { return fmt.Sprintf("blk.%d.%s", l, name) }

// Norm adds RMSNorm of x times the model's weight named weight.
func (b Block) Norm(x *core.Tensor, weight string) *core.Tensor {
	return Norm(b.g, b.c, x, b.h.Weight(b.g, weight))
}

// Linear adds x times layer l's matrix name ("attn_output", "ffn_down", ...), its node named
// name, as the host builds it (a W8A8 lowering and taps apply).
func (b Block) Linear(x *core.Tensor, l int, name string) *core.Tensor {
	return b.h.Linear(b.g, x, l, name)
}

// heads views t [C, n·D] as n heads [C, n, D].
func (b Block) heads(t *core.Tensor, n int) *core.Tensor {
	if t == nil {
		return nil // the graph has recorded its error
	}
	return b.g.Reshape(t, t.Shape[0], int64(n), int64(b.c.HeadDim))
}

// normAs is RMSNorm over the last axis times the weight, its MUL named name: Gemma's
// post-norms, and the per-head norms of q or k [C, H, D] with a [D] weight (Qwen3, Gemma 3).
func (b Block) normAs(name string, x *core.Tensor, weight string) *core.Tensor {
	n := b.g.RMSNorm(x, b.c.NormEps)
	return b.g.Named(name).Mul(n, b.h.Weight(b.g, weight))
}

// projectQKV is the separate Q, K and V projections of layer l's normed input h, with their
// biases when the config has them, as heads.
func (b Block) projectQKV(h *core.Tensor, l int) (q, k, v *core.Tensor) {
	c := b.c
	proj := func(name string, heads int) *core.Tensor {
		t := b.Linear(h, l, name)
		if c.QKVBias {
			t = b.g.Add(t, b.h.Weight(b.g, LayerName(l, name+".bias")))
		}
		return b.heads(t, heads)
	}
	return proj("attn_q", c.Heads), proj("attn_k", c.KVHeads), proj("attn_v", c.KVHeads)
}

// ropeQK rotates layer l's queries and keys (unless the layer has no RoPE).
func (b Block) ropeQK(q, k *core.Tensor, pos Pos, l int) (*core.Tensor, *core.Tensor) {
	if !b.c.Rotates(l) {
		return q, k
	}
	return Rope(b.g, b.c, "q_rope", q, pos, l), Rope(b.g, b.c, "k_rope", k, pos, l)
}

// attnResidual adds layer l's attention output projection of a (post-normed when postNorm)
// to x.
func (b Block) attnResidual(x, a *core.Tensor, l int, postNorm bool) *core.Tensor {
	o := b.Linear(a, l, "attn_output")
	if postNorm {
		o = b.normAs("attn_post_norm", o, LayerName(l, "post_attention_norm.weight"))
	}
	return b.g.Named("attn_residual").Add(x, o)
}

// gatedFFN is the gated feed-forward block of layer l on x's ffn_norm: act(gate)·up, then the
// down projection.
func (b Block) gatedFFN(x *core.Tensor, l int) *core.Tensor {
	h := b.Norm(x, LayerName(l, "ffn_norm.weight"))
	gate, up := b.Linear(h, l, "ffn_gate"), b.Linear(h, l, "ffn_up")
	name := "ffn_swiglu"
	if b.c.Activation == ActGELU {
		name = "ffn_geglu"
	}
	act := Activate(b.g, b.c.Activation, gate)
	f := b.g.Named(name).Mul(act, up)
	return b.Linear(f, l, "ffn_down")
}

// head is the final norm and the output projection.
func (b Block) head(x *core.Tensor) *core.Tensor {
	b.g.SetNamePrefix("")
	h := b.Norm(x, "output_norm.weight")
	return b.g.Named("logits").MatMul(h, b.h.Weight(b.g, "output.weight"))
}

// AttentionOptions are layer l's ATTENTION options from the config over a cache of capacity
// rows: the query scale, the score soft-cap and the sliding window, which is left out where it
// hides nothing (no position in the cache is as far as the window from another). The stage
// adds causality, the query offset and a tree mask.
func (c Config) AttentionOptions(l int, capacity int64) core.AttentionOptions {
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
func (b Block) softCap(name string, x *core.Tensor, c float32) *core.Tensor {
	th := b.g.Tanh(b.g.Scale(x, 1/c, 0))
	return b.g.Named(name).Scale(th, c, 0)
}

// qkvSpecs are the separate projections' tensors of layer l (with biases when the config has
// them).
func qkvSpecs(c *Config, l int) []TensorSpec {
	D, q, kv := int64(c.Dim), int64(c.Heads*c.HeadDim), int64(c.KVHeads*c.HeadDim)
	s := []TensorSpec{
		{Name: LayerName(l, "attn_q.weight"), Shape: core.Shape{q, D}},
		{Name: LayerName(l, "attn_k.weight"), Shape: core.Shape{kv, D}},
		{Name: LayerName(l, "attn_v.weight"), Shape: core.Shape{kv, D}},
	}
	if c.QKVBias {
		s = append(s,
			TensorSpec{Name: LayerName(l, "attn_q.bias"), Shape: core.Shape{q}, Vector: true},
			TensorSpec{Name: LayerName(l, "attn_k.bias"), Shape: core.Shape{kv}, Vector: true},
			TensorSpec{Name: LayerName(l, "attn_v.bias"), Shape: core.Shape{kv}, Vector: true})
	}
	return s
}

// layerSpecs are the tensors every layer has besides its Q, K, V projections: the norms, the
// output projection and the FFN (gate separate unless fused).
func layerSpecs(c *Config, l int, fusedFFN bool) []TensorSpec {
	D, F := int64(c.Dim), int64(c.FFN)
	s := []TensorSpec{
		{Name: LayerName(l, "attn_norm.weight"), Shape: core.Shape{D}, Vector: true},
		{Name: LayerName(l, "attn_output.weight"), Shape: core.Shape{D, int64(c.Heads * c.HeadDim)}},
		{Name: LayerName(l, "ffn_norm.weight"), Shape: core.Shape{D}, Vector: true},
		{Name: LayerName(l, "ffn_down.weight"), Shape: core.Shape{D, F}},
	}
	if fusedFFN {
		return append(s, TensorSpec{Name: LayerName(l, "ffn_up.weight"), Shape: core.Shape{2 * F, D}})
	}
	return append(s,
		TensorSpec{Name: LayerName(l, "ffn_gate.weight"), Shape: core.Shape{F, D}},
		TensorSpec{Name: LayerName(l, "ffn_up.weight"), Shape: core.Shape{F, D}})
}

// headNormSpecs are the per-head norms of q and k.
func headNormSpecs(c *Config, l int) []TensorSpec {
	D := core.Shape{int64(c.HeadDim)}
	return []TensorSpec{
		{Name: LayerName(l, "attn_q_norm.weight"), Shape: D, Vector: true},
		{Name: LayerName(l, "attn_k_norm.weight"), Shape: D, Vector: true},
	}
}

// ropeFactors reads a RoPE frequency factor tensor: nil when absent; it must hold RopeDims/2
// positive factors, or HeadDim/2 of which the first RopeDims/2 count (llama.cpp declares
// phi3's factors per head dim even with partial rotary).
func ropeFactors(ld Loader, name string) ([]float32, error) {
	c := ld.Config
	t, ok := ld.File.Tensor(name)
	if !ok {
		return nil, nil
	}
	want := core.Shape{int64(c.RopeDims / 2)}
	if !t.Shape.Equal(want) && !t.Shape.Equal(core.Shape{int64(c.HeadDim / 2)}) {
		return nil, fmt.Errorf("arch: tensor %s is %s, want %s: %w", name, t.Shape, want, core.ErrInvalidArgument)
	}
	f, err := core.Dequantize(t.DType, ld.File.TensorData(t), 0)
	if err != nil {
		return nil, fmt.Errorf("arch: tensor %s: %w", name, err)
	}
	f = f[:c.RopeDims/2]
	for i, x := range f {
		if !(x > 0) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("arch: %s[%d] = %g must be positive: %w", name, i, x, core.ErrInvalidArgument)
		}
	}
	return f, nil
}
