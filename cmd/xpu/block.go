package main

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/xpuhub/xpu/core"
)

// blockConfig is the shape of the demo's transformer block (a Llama block, scaled down).
type blockConfig struct {
	Tokens, Dim, Heads, KVHeads, FFN int64
	WeightType                       core.DType
}

func (c blockConfig) headDim() int64 { return c.Dim / c.Heads }

// buildBlock builds one Llama-style transformer block over x [T, Dim] with seeded random
// weights: RMSNorm, Q/K/V projections, RoPE, causal grouped-query attention, output
// projection, residual, RMSNorm, SwiGLU FFN, residual. Inputs: x (f32 [T, Dim]), pos (i32 [T]).
func buildBlock(cfg blockConfig, seed uint64) (*core.Graph, error) {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	g := core.NewGraph()
	weight := func(name string, rows, cols int64) (*core.Tensor, error) {
		xs := make([]float32, rows*cols)
		sd := 1 / math.Sqrt(float64(cols))
		for i := range xs {
			xs[i] = float32(rng.NormFloat64() * sd)
		}
		b, err := core.Quantize(cfg.WeightType, xs, 0)
		if err != nil {
			return nil, fmt.Errorf("weight %s: %w", name, err)
		}
		return g.Const(name, cfg.WeightType, core.Shape{rows, cols}, b), nil
	}
	norm := func(name string) *core.Tensor {
		xs := make([]float32, cfg.Dim)
		for i := range xs {
			xs[i] = float32(1 + 0.1*rng.NormFloat64())
		}
		return g.Const(name, core.F32, core.Shape{cfg.Dim}, core.EncodeF32(xs))
	}
	T, D, H, KVH, HD := cfg.Tokens, cfg.Dim, cfg.Heads, cfg.KVHeads, cfg.headDim()
	var ws [7]*core.Tensor
	for i, spec := range []struct {
		name       string
		rows, cols int64
	}{{"wq", D, D}, {"wk", KVH * HD, D}, {"wv", KVH * HD, D}, {"wo", D, D},
		{"w_gate", cfg.FFN, D}, {"w_up", cfg.FFN, D}, {"w_down", D, cfg.FFN}} {
		w, err := weight(spec.name, spec.rows, spec.cols)
		if err != nil {
			return nil, err
		}
		ws[i] = w
	}
	attnNorm, ffnNorm := norm("attn_norm"), norm("ffn_norm")

	x := g.Input("x", core.F32, T, D)
	pos := g.Input("pos", core.I32, T)
	h := g.Rename(g.Mul(g.RMSNorm(x, 1e-5), attnNorm), "attn_in")
	q := g.Reshape(g.Rename(g.MatMul(h, ws[0]), "q"), T, H, HD)
	k := g.Reshape(g.Rename(g.MatMul(h, ws[1]), "k"), T, KVH, HD)
	v := g.Reshape(g.Rename(g.MatMul(h, ws[2]), "v"), T, KVH, HD)
	q = g.RoPE(q, pos, core.RoPEOptions{})
	k = g.RoPE(k, pos, core.RoPEOptions{})
	a := g.Attention(q, k, v, core.AttentionOptions{Causal: true})
	a = g.Rename(g.MatMul(g.Reshape(a, T, D), ws[3]), "attn_out")
	x = g.Add(x, a)
	f := g.Mul(g.RMSNorm(x, 1e-5), ffnNorm)
	gate := g.SiLU(g.Rename(g.MatMul(f, ws[4]), "ffn_gate"))
	up := g.Rename(g.MatMul(f, ws[5]), "ffn_up")
	f = g.Rename(g.MatMul(g.Mul(gate, up), ws[6]), "ffn_down")
	g.Output(g.Add(x, f))
	return g, g.Err()
}

// blockInputs returns seeded inputs for buildBlock's graph.
func blockInputs(cfg blockConfig, seed uint64) [][]byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	xs := make([]float32, cfg.Tokens*cfg.Dim)
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	pos := make([]int32, cfg.Tokens)
	for i := range pos {
		pos[i] = int32(i)
	}
	return [][]byte{core.EncodeF32(xs), core.EncodeI32(pos)}
}
