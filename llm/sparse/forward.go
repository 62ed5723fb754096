package sparse

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/arch"
)

// Forward runs m over tokens in plain Go (float32 arithmetic, weights dequantized a row at a
// time, so memory stays at the activations), layer-major: every token passes layer l before
// any passes layer l+1, so each weight is read once for the whole calibration text. visit is
// called per layer with the FFN inputs x ([T, D], after ffn_norm) and the gate pre-activations
// ([T, F]); it must not keep them. It returns the last token's logits.
//
// This is the offline profiler's engine (plan-sparse, gen-model's sparsity measurement): slow
// next to the plugins (no SIMD), but it exposes what the stage graphs keep inside.
func Forward(ctx context.Context, m *llm.Model, tokens []int32, visit func(l int, x, gate []float32) error) ([]float32, error) {
	c := m.Config
	if err := m.RequireLlamaShape("the Go forward pass"); err != nil {
		return nil, err
	}
	if c.RopeFreqFactors != nil {
		return nil, fmt.Errorf("sparse: models with RoPE frequency factors: %w", core.ErrUnsupported)
	}
	T, D, F := len(tokens), c.Dim, c.FFN
	if T == 0 {
		return nil, fmt.Errorf("sparse: no tokens to run: %w", core.ErrInvalidArgument)
	}
	w := func(name string) ([]byte, core.DType, error) {
		t, ok := m.File.Tensor(name)
		if !ok {
			return nil, 0, fmt.Errorf("sparse: tensor %s missing: %w", name, core.ErrNotFound)
		}
		return m.File.TensorData(t), t.DType, nil
	}
	vec := func(name string) ([]float32, error) {
		b, dt, err := w(name)
		if err != nil {
			return nil, err
		}
		return core.Dequantize(dt, b, 0)
	}
	// embedding rows
	eb, edt, err := w("token_embd.weight")
	if err != nil {
		return nil, err
	}
	rowB := edt.Bytes(int64(D))
	x := make([]float32, T*D)
	for t, id := range tokens {
		if id < 0 || int(id) >= c.Vocab {
			return nil, fmt.Errorf("sparse: token %d outside the vocabulary (%d): %w", id, c.Vocab, core.ErrInvalidArgument)
		}
		r, err := core.Dequantize(edt, eb[int64(id)*rowB:int64(id+1)*rowB], 0)
		if err != nil {
			return nil, err
		}
		copy(x[t*D:], r)
	}
	mm := func(name string, in []float32, k, n int) ([]float32, error) {
		b, dt, err := w(name)
		if err != nil {
			return nil, err
		}
		if int64(len(b)) != dt.Bytes(int64(n)*int64(k)) {
			return nil, fmt.Errorf("sparse: %s is not [%d, %d]: %w", name, n, k, core.ErrInvalidArgument)
		}
		return matmul(ctx, b, dt, in, T, k, n)
	}
	H, Hkv, HD := c.Heads, c.KVHeads, c.HeadDim
	KV := Hkv * HD
	h := make([]float32, T*D)
	for l := 0; l < c.Layers; l++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		p := fmt.Sprintf("blk.%d.", l)
		nw, err := vec(p + "attn_norm.weight")
		if err != nil {
			return nil, err
		}
		rmsNorm(h, x, nw, D, c.NormEps)
		q, err := mm(p+"attn_q.weight", h, D, D)
		if err != nil {
			return nil, err
		}
		k, err := mm(p+"attn_k.weight", h, D, KV)
		if err != nil {
			return nil, err
		}
		v, err := mm(p+"attn_v.weight", h, D, KV)
		if err != nil {
			return nil, err
		}
		if c.QKVBias {
			for _, bv := range []struct {
				name string
				y    []float32
				n    int
			}{{"attn_q.bias", q, D}, {"attn_k.bias", k, KV}, {"attn_v.bias", v, KV}} {
				b, err := vec(p + bv.name)
				if err != nil {
					return nil, err
				}
				for t := 0; t < T; t++ {
					for i := 0; i < bv.n; i++ {
						bv.y[t*bv.n+i] += b[i]
					}
				}
			}
		}
		rope(q, T, H, HD, c)
		rope(k, T, Hkv, HD, c)
		a := attention(q, k, v, T, H, Hkv, HD)
		o, err := mm(p+"attn_output.weight", a, D, D)
		if err != nil {
			return nil, err
		}
		for i := range x {
			x[i] += o[i]
		}
		fw, err := vec(p + "ffn_norm.weight")
		if err != nil {
			return nil, err
		}
		rmsNorm(h, x, fw, D, c.NormEps)
		gate, err := mm(p+"ffn_gate.weight", h, D, F)
		if err != nil {
			return nil, err
		}
		if visit != nil {
			if err := visit(l, h, gate); err != nil {
				return nil, err
			}
		}
		up, err := mm(p+"ffn_up.weight", h, D, F)
		if err != nil {
			return nil, err
		}
		for i, g := range gate {
			up[i] *= act(c.Activation, g)
		}
		down, err := mm(p+"ffn_down.weight", up, F, D)
		if err != nil {
			return nil, err
		}
		for i := range x {
			x[i] += down[i]
		}
	}
	nw, err := vec("output_norm.weight")
	if err != nil {
		return nil, err
	}
	last := make([]float32, D)
	rmsNorm(last, x[(T-1)*D:], nw, D, c.NormEps)
	ob, odt, err := w("output.weight")
	if err != nil {
		return nil, err
	}
	return matmul(ctx, ob, odt, last, 1, D, c.Vocab)
}

// act is the FFN activation of one gate value.
func act(a arch.Activation, g float32) float32 {
	switch a {
	case arch.ActReLU:
		return max(0, g)
	case arch.ActReLU2:
		r := max(0, g)
		return r * r
	}
	return g / (1 + float32(math.Exp(float64(-g))))
}

func rmsNorm(dst, x, w []float32, d int, eps float32) {
	for t := 0; t*d < len(x) && t*d < len(dst); t++ {
		row := x[t*d : (t+1)*d]
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		s := float32(1 / math.Sqrt(ss/float64(d)+float64(eps)))
		for i, v := range row {
			dst[t*d+i] = v * s * w[i]
		}
	}
}

func rope(y []float32, T, H, HD int, c llm.Config) {
	R := c.RopeDims
	for t := 0; t < T; t++ {
		for i := 0; i < R/2; i++ {
			theta := float64(t) * float64(c.RopeFreqScale) * math.Pow(float64(c.RopeBase), -2*float64(i)/float64(R))
			s, co := math.Sincos(theta)
			for h := 0; h < H; h++ {
				base := (t*H + h) * HD
				a, b := base+2*i, base+2*i+1
				if c.RopeMode == core.RoPENeoX {
					a, b = base+i, base+i+R/2
				}
				u, v := float64(y[a]), float64(y[b])
				y[a], y[b] = float32(u*co-v*s), float32(u*s+v*co)
			}
		}
	}
}

// attention is causal grouped-query attention over all T tokens.
func attention(q, k, v []float32, T, H, Hkv, HD int) []float32 {
	out := make([]float32, T*H*HD)
	scale := float32(1 / math.Sqrt(float64(HD)))
	grp := H / Hkv
	sc := make([]float32, T)
	for t := 0; t < T; t++ {
		for h := 0; h < H; h++ {
			qh := q[(t*H+h)*HD : (t*H+h+1)*HD]
			kh := h / grp
			mx := float32(math.Inf(-1))
			for j := 0; j <= t; j++ {
				sc[j] = dot(qh, k[(j*Hkv+kh)*HD:(j*Hkv+kh+1)*HD]) * scale
				mx = max(mx, sc[j])
			}
			var sum float32
			for j := 0; j <= t; j++ {
				sc[j] = float32(math.Exp(float64(sc[j] - mx)))
				sum += sc[j]
			}
			o := out[(t*H+h)*HD : (t*H+h+1)*HD]
			for j := 0; j <= t; j++ {
				p := sc[j] / sum
				vj := v[(j*Hkv+kh)*HD : (j*Hkv+kh+1)*HD]
				for i := range o {
					o[i] += p * vj[i]
				}
			}
		}
	}
	return out
}

// matmul is y[T, n] = x[T, k] · W[n, k]ᵀ with W in dtype dt, rows dequantized by the worker
// that uses them.
func matmul(ctx context.Context, w []byte, dt core.DType, x []float32, T, k, n int) ([]float32, error) {
	y := make([]float32, T*n)
	rb := dt.Bytes(int64(k))
	workers := min(runtime.GOMAXPROCS(0), n)
	const chunk = 64
	var mu sync.Mutex
	next := 0
	var firstErr error
	var wg sync.WaitGroup
	for wk := 0; wk < workers; wk++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				lo := next
				next += chunk
				stop := firstErr != nil
				mu.Unlock()
				if lo >= n || stop {
					return
				}
				if err := ctx.Err(); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				hi := min(n, lo+chunk)
				rows, err := core.Dequantize(dt, w[int64(lo)*rb:int64(hi)*rb], 0)
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				for r := lo; r < hi; r++ {
					wr := rows[(r-lo)*k : (r-lo+1)*k]
					for t := 0; t < T; t++ {
						y[t*n+r] = dot(wr, x[t*k:(t+1)*k])
					}
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return y, nil
}
