// Package kvcache holds what the KV cache is made of: the K and V dtypes and their row sizes,
// and the program that rotates cached keys for a context shift (a stage converts its new rows
// into the dtypes with arch.ConvertKV).
package kvcache

import (
	"fmt"
	"strings"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/arch"
)

// KV cache dtypes. The cache holds every layer's K and V rows; its dtype trades memory and the
// bytes attention reads per token against precision. F16 is the default, as llama.cpp's: half
// of F32's memory for a rounding the logits barely see. Q8_0 and Q4_0 store GGUF blocks of 32
// values along the head dimension (about 0.53 and 0.28 bytes per value), written through
// QUANTIZE when a stage appends its rows and read natively by ATTENTION. K and V may differ,
// as llama.cpp's -ctk and -ctv allow (K is the more sensitive of the two: its rounding moves
// every score).

// DefaultType is the K and V cache dtype of a runner without a chosen one.
const DefaultType = core.F16

// Types are the dtypes of the K and the V cache.
type Types struct{ K, V core.DType }

// RowBytes are the bytes of one cache row (every KV head of one position) of K and of V.
func (t Types) RowBytes(c arch.Config) (k, v int64) {
	n := int64(c.KVHeads * c.HeadDim)
	return t.K.Bytes(n), t.V.Bytes(n)
}

// String names the dtypes as llama.cpp spells them, once when K and V share one.
func (t Types) String() string {
	if t.K == t.V {
		return t.K.String()
	}
	return "k " + t.K.String() + ", v " + t.V.String()
}

// types are the dtypes a KV cache may have.
var types = []core.DType{core.F32, core.F16, core.Q8_0, core.Q4_0}

// ParseType parses a KV cache dtype as llama.cpp's --cache-type-k and --cache-type-v
// spell it: f32, f16, q8_0 or q4_0 (any case). Another name is core.ErrInvalidArgument.
func ParseType(s string) (core.DType, error) {
	dt, err := core.ParseDType(s)
	if err == nil && isType(dt) {
		return dt, nil
	}
	names := make([]string, len(types))
	for i, t := range types {
		names[i] = strings.ToLower(t.String())
	}
	return core.InvalidDType, fmt.Errorf("kvcache: KV cache type %q: want one of %s: %w", s, strings.Join(names, ", "), core.ErrInvalidArgument)
}

func isType(dt core.DType) bool {
	for _, t := range types {
		if dt == t {
			return true
		}
	}
	return false
}

// Check checks that a cache of heads headDim wide can have dtypes t: blocks of a quantized cache run along
// the head dimension, so it must be a whole number of them.
func Check(headDim int, t Types) error {
	for _, dt := range []core.DType{t.K, t.V} {
		if !isType(dt) {
			return fmt.Errorf("kvcache: KV cache type %s (f32, f16, q8_0 or q4_0): %w", dt, core.ErrInvalidArgument)
		}
		if b := dt.BlockLen(); int64(headDim)%b != 0 {
			return fmt.Errorf("kvcache: KV cache type %s needs a head dimension that is a multiple of %d; the model's is %d (f16 or f32 fit any): %w",
				dt, b, headDim, core.ErrInvalidArgument)
		}
	}
	return nil
}

// Bytes is the memory one of two caches (K or V) of a model of config c takes for ctxLen positions in
// dtype dt: every layer's rows.
func Bytes(c arch.Config, ctxLen int, dt core.DType) int64 {
	return int64(c.Layers) * int64(ctxLen) * dt.Bytes(int64(c.KVHeads*c.HeadDim))
}

// ShiftGraph builds the K rotation of a context shift over rows cache rows of dtype kt in every
// layer of a model of config c: RoPE is linear in the position, so rotating a cached key by -n
// moves it n positions back. Inputs: the delta's positions (or RoPE tables), then
// "blk.<l>.k_cache" [rows, Hkv, D] per layer; outputs: the rotated rows per layer. A quantized
// K is dequantized, rotated and quantized again.
func ShiftGraph(c *arch.Config, rows int64, kt core.DType) (*core.Graph, error) {
	g := core.NewGraph()
	pos := arch.PosInputs(g, c, rows)
	var outs []*core.Tensor
	for l := range c.Layers {
		g.SetNamePrefix(fmt.Sprintf("blk.%d.", l))
		k := g.Input(fmt.Sprintf("blk.%d.k_cache", l), kt, rows, int64(c.KVHeads), int64(c.HeadDim))
		x := k
		switch kt {
		case core.F32:
		case core.Q8_0, core.Q4_0:
			x = g.Dequantize(k, 0)
		default:
			x = g.Cast(k, core.F32)
		}
		outs = append(outs, arch.ConvertKV(g, arch.Rope(g, c, "k_rope", x, pos, l), kt))
	}
	g.Output(outs...)
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("kvcache: building the context shift: %w", err)
	}
	return g, nil
}
