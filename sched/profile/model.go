package profile

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/xpuhub/xpu/core"
)

// Op classes a profile times. MATMUL and ATTENTION are the ops; RMS_NORM stands for a norm
// with its weight multiply, ROPE for the rotation of q and k, ELEMENTWISE for an ADD, MUL or
// SILU over [M, N] (they cost the same: one pass over memory).
const (
	OpMatMul      = "MATMUL"
	OpAttention   = "ATTENTION"
	OpNorm        = "RMS_NORM"
	OpRope        = "ROPE"
	OpElementwise = "ELEMENTWISE"
	// OpAttentionHeads is one decode row of ATTENTION over half the KV heads (op set 4's head
	// range, N = those heads' query width): what a heads split's part costs on the unit, or
	// its refusal where the backend cannot run a head range.
	OpAttentionHeads = "ATTENTION_HEADS"
)

// Model is the shape of a Llama-family model as far as costs go: no weights, no tokenizer.
// The CLI fills it from a GGUF's config; package soc ships the configs of the papers' models.
type Model struct {
	Name    string `json:"name"`
	Layers  int    `json:"layers"`
	Dim     int    `json:"dim"`
	FFN     int    `json:"ffn"`
	Heads   int    `json:"heads"`
	KVHeads int    `json:"kv_heads"`
	HeadDim int    `json:"head_dim"`
	Vocab   int    `json:"vocab"`
	// DType is the weight type of the layers' projections ("q4_0", "f16", ...).
	DType string `json:"dtype"`
	// OutputDType is the output head's weight type ("" means DType).
	OutputDType string `json:"output_dtype,omitempty"`
}

// ErrOtherModel: a profile measured for a model of other shapes than the one it is used for.
var ErrOtherModel = errors.New("profile of another model")

// Match reports (ErrOtherModel, naming each difference) whether o has m's shapes and weight
// types, the figures a profile's predictions depend on; the names may differ (a copied file).
func (m Model) Match(o Model) error {
	var diff []string
	for _, f := range []struct {
		what string
		a, b any
	}{
		{"layers", m.Layers, o.Layers}, {"dim", m.Dim, o.Dim}, {"ffn", m.FFN, o.FFN}, {"heads", m.Heads, o.Heads},
		{"kv heads", m.KVHeads, o.KVHeads}, {"head dim", m.HeadDim, o.HeadDim}, {"vocab", m.Vocab, o.Vocab},
		{"weights", m.DType, o.DType}, {"output weights", m.outputDType(), o.outputDType()},
	} {
		if f.a != f.b {
			diff = append(diff, fmt.Sprintf("%s %v, not %v", f.what, f.a, f.b))
		}
	}
	if len(diff) == 0 {
		return nil
	}
	return fmt.Errorf("%w: it was measured for %s (%s)", ErrOtherModel, m.Name, strings.Join(diff, ", "))
}

// Validate checks that every dimension is positive and the dtypes parse.
func (m Model) Validate() error {
	if m.Layers < 1 || m.Dim < 1 || m.FFN < 1 || m.Heads < 1 || m.KVHeads < 1 || m.HeadDim < 1 || m.Vocab < 1 {
		return fmt.Errorf("profile: model %q: every dimension must be positive: %w", m.Name, core.ErrInvalidArgument)
	}
	if m.Heads%m.KVHeads != 0 {
		return fmt.Errorf("profile: model %q: %d heads is not a multiple of %d KV heads: %w", m.Name, m.Heads, m.KVHeads, core.ErrInvalidArgument)
	}
	for _, s := range []string{m.DType, m.outputDType()} {
		if _, err := core.ParseDType(s); err != nil {
			return fmt.Errorf("profile: model %q: weight dtype %q: %w", m.Name, s, err)
		}
	}
	return nil
}

func (m Model) outputDType() string {
	if m.OutputDType == "" {
		return m.DType
	}
	return m.OutputDType
}

// MatMul is one of a model's projections: x[M, K] · W[N, K]ᵀ.
type MatMul struct {
	Name  string // the graph's node name ("attn_q", "ffn_down", "logits")
	K, N  int
	DType string
}

// MatMuls are a layer's projections in graph order, then the output head ("logits").
func (m Model) MatMuls() []MatMul {
	q, kv := m.Heads*m.HeadDim, m.KVHeads*m.HeadDim
	return []MatMul{
		{"attn_q", m.Dim, q, m.DType},
		{"attn_k", m.Dim, kv, m.DType},
		{"attn_v", m.Dim, kv, m.DType},
		{"attn_output", q, m.Dim, m.DType},
		{"ffn_gate", m.Dim, m.FFN, m.DType},
		{"ffn_up", m.Dim, m.FFN, m.DType},
		{"ffn_down", m.FFN, m.Dim, m.DType},
		{"logits", m.Dim, m.Vocab, m.outputDType()},
	}
}

// DistinctMatMuls are the distinct (K, N, dtype) of MatMuls: what a profile measures.
func (m Model) DistinctMatMuls() []MatMul {
	var out []MatMul
	for _, mm := range m.MatMuls() {
		if !slices.ContainsFunc(out, func(o MatMul) bool { return o.K == mm.K && o.N == mm.N && o.DType == mm.DType }) {
			out = append(out, mm)
		}
	}
	return out
}

// Params is the weight count of the layers and the output head (embeddings excluded).
func (m Model) Params() int64 {
	var n int64
	for _, mm := range m.MatMuls() {
		n += int64(mm.K) * int64(mm.N) * m.copies(mm)
	}
	return n
}

// StepBytes is the weight bytes a decode step streams: every layer's projections and the
// output head's.
func (m Model) StepBytes() int64 {
	var n int64
	for _, mm := range m.MatMuls() {
		n += WeightBytes(mm.DType, mm.K, mm.N) * m.copies(mm)
	}
	return n
}

// copies is how many of projection mm the model holds: one per layer, one output head.
func (m Model) copies(mm MatMul) int64 {
	if mm.Name == "logits" {
		return 1
	}
	return int64(m.Layers)
}

// WeightBytes is the bytes of an [N, K] weight of dtype dt (0 for a dtype that does not parse).
func WeightBytes(dt string, k, n int) int64 {
	d, err := core.ParseDType(dt)
	if err != nil {
		return 0
	}
	return d.Bytes(int64(k) * int64(n))
}
