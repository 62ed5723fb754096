// Package quant rewrites a GGUF model with its weight matrices in smaller dtypes, the way
// llama.cpp's llama-quantize does (pure dtypes and the K-quant _M mixes).
package quant

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
)

// Recipe is a way to quantize a model's weight matrices: one dtype for every matrix
// ("pure": q8_0, q4_0, f16, bf16, q4_k, q5_k, q6_k, q2_k, q3_k), or one of llama.cpp's K-quant
// mixes (q4_k_m, q5_k_m), which give the output head and some attn_v/ffn_down matrices more bits.
type Recipe struct {
	// Name is the recipe as ParseRecipe reads it.
	Name string
	// Base is the dtype of the matrices no rule singles out.
	Base core.DType
	// mix selects llama.cpp's _M rules (llama_tensor_get_type for LLAMA_FTYPE_MOSTLY_Q4_K_M
	// and Q5_K_M, no importance matrix, no experts).
	mix bool
	// fileType is general.file_type (llama_ftype) for the written file; 0 leaves the key out.
	fileType uint32
}

var recipes = []Recipe{
	{Name: "q4_k_m", Base: core.Q4_K, mix: true, fileType: 15},
	{Name: "q5_k_m", Base: core.Q5_K, mix: true, fileType: 17},
	{Name: "q6_k", Base: core.Q6_K, fileType: 18},
	{Name: "q4_k", Base: core.Q4_K},
	{Name: "q5_k", Base: core.Q5_K},
	{Name: "q3_k", Base: core.Q3_K},
	{Name: "q2_k", Base: core.Q2_K},
	{Name: "q8_0", Base: core.Q8_0, fileType: 7},
	{Name: "q4_0", Base: core.Q4_0, fileType: 2},
	{Name: "f16", Base: core.F16, fileType: 1},
	{Name: "bf16", Base: core.BF16, fileType: 32},
}

// Recipes lists the recipe names ParseRecipe accepts.
func Recipes() []string {
	var ns []string
	for _, r := range recipes {
		ns = append(ns, r.Name)
	}
	return ns
}

// ParseRecipe finds a recipe by name (case-insensitive).
func ParseRecipe(name string) (Recipe, error) {
	for _, r := range recipes {
		if strings.EqualFold(r.Name, name) {
			return r, nil
		}
	}
	return Recipe{}, fmt.Errorf("quant: quantization type %q (want one of %s): %w", name,
		strings.Join(Recipes(), ", "), core.ErrInvalidArgument)
}

// TensorPlan is what quantizing does to one tensor.
type TensorPlan struct {
	Name  string
	Shape core.Shape
	From  core.DType
	To    core.DType
	// Fallback says why To is not the dtype the recipe wanted (its rows are not a whole number
	// of blocks), or is empty.
	Fallback string
}

// useMoreBits is llama.cpp's choice of the layers that get more bits in the _M mixes: the first
// and last eighth, and every third layer in between.
func useMoreBits(i, n int) bool { return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2 }

// fallbackFor is the dtype a matrix gets when its rows do not fit want's blocks. llama.cpp falls
// back to Q5_0/Q5_1 for Q2_K…Q5_K and to Q8_0 for Q6_K; the op set has no Q5_0/Q5_1, so every
// K-quant falls back to Q8_0 (never less precise than llama.cpp's choice). Rows that do not fit
// Q8_0 either stay in their float dtype (llama.cpp converts them to F16).
func fallbackFor(want core.DType, row int64, from core.DType) (core.DType, string) {
	if row%want.BlockLen() == 0 {
		return want, ""
	}
	why := fmt.Sprintf("row length %d is not a multiple of %d for %s", row, want.BlockLen(), want)
	if want.KQuant() && row%core.QK == 0 {
		return core.Q8_0, why
	}
	return from, why
}

// Plan decides each tensor's dtype. Matrices (rank 2, named *weight) in a float dtype
// are quantized; vectors (norms, biases) are kept. A matrix that is already quantized to another
// dtype is an error unless requantize is set (llama-quantize's --allow-requantize): requantizing
// loses more than quantizing the float original.
func Plan(f *gguf.File, r Recipe, requantize bool) ([]TensorPlan, error) {
	var nAttnV, nFFNDown int
	_, hasOutput := f.Tensor("output.weight")
	for _, t := range f.Tensors {
		if strings.Contains(t.Name, "attn_v.weight") {
			nAttnV++
		}
		if strings.Contains(t.Name, "ffn_down") {
			nFFNDown++
		}
	}
	var iAttnV, iFFNDown int
	plans := make([]TensorPlan, 0, len(f.Tensors))
	for _, t := range f.Tensors {
		p := TensorPlan{Name: t.Name, Shape: t.Shape, From: t.DType, To: t.DType}
		if len(t.Shape) != 2 || !strings.HasSuffix(t.Name, "weight") {
			plans = append(plans, p)
			continue
		}
		want := r.Base
		if r.mix {
			want = mixType(r, t.Name, t.Shape[1], hasOutput, &iAttnV, nAttnV, &iFFNDown, nFFNDown)
		}
		p.To, p.Fallback = fallbackFor(want, t.Shape[1], t.DType)
		if p.To != p.From && t.DType.Quantized() && !requantize {
			return nil, fmt.Errorf("quant: tensor %s is already %s; quantizing it again to %s needs requantize: %w",
				t.Name, t.DType, p.To, core.ErrInvalidArgument)
		}
		plans = append(plans, p)
	}
	return plans, nil
}

// mixType is llama.cpp's llama_tensor_get_type for the Q4_K_M/Q5_K_M mixes of a dense model.
func mixType(r Recipe, name string, row int64, hasOutput bool, iAttnV *int, nAttnV int, iFFNDown *int, nFFNDown int) core.DType {
	switch {
	case name == "output.weight" || (!hasOutput && name == "token_embd.weight"):
		if row%core.QKK != 0 {
			return core.Q8_0
		}
		return core.Q6_K
	case name == "token_embd.weight":
		return r.Base
	case strings.Contains(name, "attn_v.weight"):
		i := *iAttnV
		*iAttnV++
		if useMoreBits(i, nAttnV) {
			return core.Q6_K
		}
	case strings.Contains(name, "ffn_down"):
		i := *iFFNDown
		*iFFNDown++
		if useMoreBits(i, nFFNDown) {
			return core.Q6_K
		}
	case strings.Contains(name, "attn_qkv.weight"):
		if r.Base == core.Q4_K {
			return core.Q5_K
		}
		return core.Q6_K
	}
	return r.Base
}

// Summary counts what Model wrote.
type Summary struct {
	// Tensors is the number of tensors per written dtype.
	Tensors map[core.DType]int
	// Quantized is how many tensors changed dtype; Fallbacks how many of all matrices did not get
	// the recipe's dtype because of their row length.
	Quantized, Fallbacks int
	// BytesIn and BytesOut are the tensor data sizes before and after.
	BytesIn, BytesOut int64
}

// Option configures Model.
type Option func(*config)

type config struct {
	progress   func(done, total int, p TensorPlan)
	requantize bool
}

// WithProgress calls fn before each tensor is written (done tensors of total so far).
func WithProgress(fn func(done, total int, p TensorPlan)) Option {
	return func(c *config) { c.progress = fn }
}

// WithRequantize allows quantizing tensors that are already quantized (dequantized first).
func WithRequantize(ok bool) Option { return func(c *config) { c.requantize = ok } }

// Model writes f to w as a GGUF file with its tensors converted as Plan decides,
// one tensor in memory at a time, and the metadata kept (general.file_type set to the recipe's
// llama_ftype where it has one). ctx stops a long run between tensors.
func Model(ctx context.Context, w io.Writer, f *gguf.File, r Recipe, opts ...Option) (Summary, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	sum := Summary{Tensors: map[core.DType]int{}}
	plans, err := Plan(f, r, cfg.requantize)
	if err != nil {
		return sum, err
	}
	kvs := slices.Clone(f.KV)
	if r.fileType != 0 {
		kv := gguf.KeyValue{Key: "general.file_type", Value: gguf.MustValue(r.fileType)}
		if i := slices.IndexFunc(kvs, func(kv gguf.KeyValue) bool { return kv.Key == "general.file_type" }); i >= 0 {
			kvs[i] = kv
		} else {
			kvs = append(kvs, kv)
		}
	}
	ts := make([]gguf.WriteTensor, len(plans))
	for i, p := range plans {
		ti := &f.Tensors[i]
		data := f.TensorData(ti)
		sum.BytesIn += int64(len(data))
		sum.BytesOut += p.To.Bytes(p.Shape.NumElements())
		sum.Tensors[p.To]++
		if p.Fallback != "" {
			sum.Fallbacks++
		}
		wt := gguf.WriteTensor{Name: p.Name, DType: p.To, Shape: p.Shape, Data: data}
		if p.To != p.From {
			sum.Quantized++
			wt.Data = nil
		}
		i, p := i, p
		wt.Gen = func() ([]byte, error) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if cfg.progress != nil {
				cfg.progress(i, len(plans), p)
			}
			if p.To == p.From {
				return data, nil
			}
			xs, err := core.Dequantize(p.From, data, 0)
			if err != nil {
				return nil, err
			}
			return quantizeParallel(p.To, xs, p.Shape[len(p.Shape)-1])
		}
		ts[i] = wt
	}
	if err := gguf.Write(w, kvs, ts); err != nil {
		return sum, fmt.Errorf("quant: quantize to %s: %w", r.Name, err)
	}
	if cfg.progress != nil {
		cfg.progress(len(plans), len(plans), TensorPlan{})
	}
	return sum, nil
}

// quantizeParallel is core.Quantize split by rows over the CPUs: blocks never cross a row, so
// the bytes are the same as one call's.
func quantizeParallel(dt core.DType, xs []float32, row int64) ([]byte, error) {
	rows := int64(len(xs)) / max(row, 1)
	workers := int64(min(runtime.GOMAXPROCS(0), 16))
	if workers < 2 || rows < 2*workers || int64(len(xs)) < 1<<16 {
		return core.Quantize(dt, xs, 0)
	}
	out := make([]byte, dt.Bytes(int64(len(xs))))
	rowBytes := dt.Bytes(row)
	per := (rows + workers - 1) / workers
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w, r0 := 0, int64(0); r0 < rows; w, r0 = w+1, r0+per {
		r1 := min(r0+per, rows)
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := core.Quantize(dt, xs[r0*row:r1*row], 0)
			copy(out[r0*rowBytes:], b)
			errs[w] = err
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// Pure rewrites a GGUF image with its float matrices in dt (one dtype, every matrix: see
// Recipe), the way llama-quantize --pure does for a float model: 1-D tensors (norms, biases)
// stay F32, and so does a matrix whose rows are not a whole number of dt's blocks (stories260K's
// ffn_down, 172 wide). The metadata is kept.
func Pure(f *gguf.File, dt core.DType) ([]byte, error) {
	if _, err := gguf.TypeOf(dt); err != nil || dt == core.I8 {
		if err == nil {
			err = fmt.Errorf("quant: quantize to i8: a scale-less GGUF type (xpu quantize --npu-int8 adds int8 weights): %w", core.ErrUnsupported)
		}
		return nil, err
	}
	var buf bytes.Buffer
	if _, err := Model(context.Background(), &buf, f, Recipe{Name: dt.String(), Base: dt}); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// NMSE is Σ(got−want)² / Σwant² (0 when both are all zero, +Inf when only want is).
func NMSE(got, want []float32) float64 {
	var num, den float64
	for i := range want {
		d := float64(got[i]) - float64(want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	if den == 0 {
		if num == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return num / den
}

// NMSEBound is the logits NMSE (Σ(q-f)² / Σf², teacher-forced) that a variant made by
// Pure may show against its float model, per matrix dtype. Measured for stories260K on
// core/ref over a 45-token prompt: Q8_0 3.6e-5, Q4_0 1.9e-2; the bounds leave room (14× and 5×)
// for backends that also quantize activations on the fly, as OPS.md allows.
var NMSEBound = map[core.DType]float64{core.Q8_0: 5e-4, core.Q4_0: 1e-1}
