package core

// Builder methods, one per op of abi/OPS.md. Each returns the node's output tensor, or nil once
// the graph has an error (see Graph.Err). Names are optional: Named sets the next node's name.

// Named sets the name of the next node added (then resets). It returns g for chaining:
// g.Named("attn_q").MatMul(x, wq). The arguments are evaluated after Named, so they must not
// add nodes themselves (g.Named("a").MatMul(g.SiLU(x), w) names the SILU); use Rename then.
func (g *Graph) Named(name string) *Graph {
	g.nextName = name
	return g
}

// Rename gives the node that produced t (and t) a new unique name, and returns t.
func (g *Graph) Rename(t *Tensor, name string) *Tensor {
	if g.err != nil || t == nil || t.Producer < 0 {
		return t
	}
	delete(g.names, t.Name)
	n := g.Nodes[t.Producer]
	n.Name = g.uniqueName(g.prefix + name)
	t.Name = n.Name
	g.names[t.Name] = t.ID
	return t
}

func (g *Graph) spec(op Op, inputs ...*Tensor) nodeSpec {
	s := nodeSpec{op: op, name: g.nextName, inputs: inputs}
	g.nextName = ""
	return s
}

// addF adds a node of op on inputs whose one float attribute (fattr[0]: an epsilon, a scale, a
// threshold) is f.
func (g *Graph) addF(op Op, f float32, inputs ...*Tensor) *Tensor {
	s := g.spec(op, inputs...)
	s.fattr[0] = f
	return g.add(s)
}

// Add returns a + b (broadcasting).
func (g *Graph) Add(a, b *Tensor) *Tensor { return g.add(g.spec(OpAdd, a, b)) }

// Sub returns a - b (broadcasting).
func (g *Graph) Sub(a, b *Tensor) *Tensor { return g.add(g.spec(OpSub, a, b)) }

// Mul returns a * b (broadcasting).
func (g *Graph) Mul(a, b *Tensor) *Tensor { return g.add(g.spec(OpMul, a, b)) }

// Div returns a / b (broadcasting).
func (g *Graph) Div(a, b *Tensor) *Tensor { return g.add(g.spec(OpDiv, a, b)) }

// SiLU returns x * sigmoid(x).
func (g *Graph) SiLU(x *Tensor) *Tensor { return g.add(g.spec(OpSiLU, x)) }

// Tanh returns tanh(x) (op set 5).
func (g *Graph) Tanh(x *Tensor) *Tensor { return g.add(g.spec(OpTanh, x)) }

// GELU returns the tanh approximation of GELU.
func (g *Graph) GELU(x *Tensor) *Tensor { return g.add(g.spec(OpGELU, x)) }

// ReLU returns max(x, 0).
func (g *Graph) ReLU(x *Tensor) *Tensor { return g.add(g.spec(OpReLU, x)) }

// Exp returns e^x.
func (g *Graph) Exp(x *Tensor) *Tensor { return g.add(g.spec(OpExp, x)) }

// Neg returns -x.
func (g *Graph) Neg(x *Tensor) *Tensor { return g.add(g.spec(OpNeg, x)) }

// Scale returns x*scale + bias.
func (g *Graph) Scale(x *Tensor, scale, bias float32) *Tensor {
	s := g.spec(OpScale, x)
	s.fattr[0], s.fattr[1] = scale, bias
	return g.add(s)
}

// RMSNorm normalizes the last axis by its root mean square.
func (g *Graph) RMSNorm(x *Tensor, eps float32) *Tensor {
	return g.addF(OpRMSNorm, eps, x)
}

// LayerNorm normalizes the last axis to zero mean and unit variance.
func (g *Graph) LayerNorm(x *Tensor, eps float32) *Tensor {
	return g.addF(OpLayerNorm, eps, x)
}

// Softmax is softmax(x*scale) over the last axis (scale 0 means 1).
func (g *Graph) Softmax(x *Tensor, scale float32) *Tensor {
	return g.addF(OpSoftmax, scale, x)
}

// CausalSoftmax is Softmax with element (i, j) of the last two axes masked when j > i+offset.
func (g *Graph) CausalSoftmax(x *Tensor, scale float32, offset int64) *Tensor {
	s := g.spec(OpSoftmax, x)
	s.fattr[0] = scale
	s.iattr[0], s.iattr[1] = 1, offset
	return g.add(s)
}

// MatMul returns a × bᵀ: a [..., M, K], b [..., N, K] (F32/F16/BF16/Q8_0/Q4_0/K-quant/I8) → [..., M, N].
func (g *Graph) MatMul(a, b *Tensor) *Tensor { return g.add(g.spec(OpMatMul, a, b)) }

// MatMulI8 is MatMul with an I8 b whose values are scale*q.
func (g *Graph) MatMulI8(a, b *Tensor, scale float32) *Tensor {
	return g.addF(OpMatMul, scale, a, b)
}

// W8A8Options configure MatMulW8A8 (op set 3, abi/OPS.md "Int8 activations").
type W8A8Options struct {
	// AScale is the I8 activation's per-tensor scale (> 0): a = AScale·qa.
	AScale float32
	// BScale is the I8 weight's per-tensor scale (> 0); it must be 0 when BScales is set.
	BScale float32
	// BScales, an F32 [N] tensor of positive values, gives one weight scale per output channel
	// (it becomes MATMUL's 3rd input).
	BScales *Tensor
	// OutScale > 0 puts the result on the 16-bit grid OutScale·[-32767, 32767], what an NPU's
	// 8-bit MatMul with a 16-bit scaled output produces; 0 means no grid.
	OutScale float32
	// Out is the output dtype, F32 (the default) or F16.
	Out DType
}

// MatMulW8A8 is MATMUL of an I8 activation a [..., M, K] (or [K]) and an I8 weight b [N, K]:
// the integer products are summed exactly and scaled by AScale·BScale (or BScales[n]).
func (g *Graph) MatMulW8A8(a, b *Tensor, o W8A8Options) *Tensor {
	in := []*Tensor{a, b}
	if o.BScales != nil {
		in = append(in, o.BScales)
	}
	s := g.spec(OpMatMul, in...)
	s.fattr[0], s.fattr[1], s.fattr[2] = o.BScale, o.AScale, o.OutScale
	s.outDType = o.Out
	if s.outDType == InvalidDType {
		s.outDType = F32
	}
	return g.add(s)
}

// ShadowMatMul is mllm-NPU's shadow outlier product (op set 3): out[m, n] = Σ_c e(x[m, ids[c]])·wt[c, n]
// with e(v) = v − clamp(v, −threshold, threshold). x is [M, K] or [K] (float), wt [C, N] F32 or
// F16 holds the weight columns of the channels ids (I32 [C] in [0, K)); a nil ids means all K
// channels in order.
func (g *Graph) ShadowMatMul(x, wt, ids *Tensor, threshold float32) *Tensor {
	in := []*Tensor{x, wt}
	if ids != nil {
		in = append(in, ids)
	}
	return g.addF(OpShadowMatMul, threshold, in...)
}

// SparseAct is SPARSE_FFN's activation (iattr[0]).
type SparseAct int64

// SPARSE_FFN activations.
const (
	SparseReLU  SparseAct = 0 // max(v, 0)
	SparseReLU2 SparseAct = 1 // max(v, 0)²
	SparseSiLU  SparseAct = 2 // v·sigmoid(v) (never exactly 0: nothing is skipped)
)

// SparseFFNOptions configure SparseFFN.
type SparseFFNOptions struct {
	Act SparseAct
	// Ungated bundles hold up | down (h = act(up·x)); gated ones gate | up | down
	// (h = act(gate·x)·(up·x)).
	Ungated bool
}

// SparseFFN is PowerInfer-2's neuron-bundle FFN (op set 3): out[m] = Σ_k h(m, idx[k])·down(idx[k])
// over the bundle rows idx lists (I32 [K], -1 an empty slot), each row of bundles [S, R]
// holding one neuron's gate row, up row and down column (abi/OPS.md). x is [M, D] or [D].
func (g *Graph) SparseFFN(x, bundles, idx *Tensor, o SparseFFNOptions) *Tensor {
	s := g.spec(OpSparseFFN, x, bundles, idx)
	s.iattr[0] = int64(o.Act)
	if o.Ungated {
		s.iattr[1] = 1
	}
	return g.add(s)
}

// RoPEOptions are the rotary embedding parameters; zero values mean the OPS.md defaults.
type RoPEOptions struct {
	Mode      int64   // RoPENormal or RoPENeoX
	Dims      int64   // rotary dims; 0 = the whole head
	Base      float32 // 0 = 10000
	FreqScale float32 // 0 = 1
}

// RoPE rotates x [T, H, D] by the positions pos (i32 [T]).
func (g *Graph) RoPE(x, pos *Tensor, o RoPEOptions) *Tensor {
	s := g.spec(OpRoPE, x, pos)
	s.iattr[0], s.iattr[1] = o.Mode, o.Dims
	s.fattr[0], s.fattr[1] = o.Base, o.FreqScale
	return g.add(s)
}

// TreeMask is the AttentionOptions.Mask data of a token tree given by parents (-1 = a root, a
// parent before its child): the i8 [T, T] matrix whose row i marks token i and its ancestors.
func TreeMask(parents []int) []byte {
	T := len(parents)
	m := make([]byte, T*T)
	for i := range parents {
		for a := i; a >= 0; a = parents[a] {
			m[i*T+a] = 1
		}
	}
	return m
}

// AttentionOptions configure Attention; zero values mean the OPS.md defaults.
type AttentionOptions struct {
	Scale  float32 // 0 = 1/sqrt(D)
	Causal bool
	// QOffset is the absolute position of the first query, used when QOffsetInput is nil.
	QOffset int64
	// QOffsetInput, an i32 [1] tensor, gives the offset at execution time: the graph's shape
	// then does not depend on the position (static-shape backends reuse it for every chunk).
	QOffsetInput *Tensor
	// Mask, an i8 [Tq, Tq] tensor (op set v2), replaces the causal rule inside the block of the
	// Tq new keys: query i sees key QOffset+j iff Mask[i, j] != 0, every key before QOffset,
	// and nothing after the block. It verifies a draft token tree in one pass (speculative
	// decoding); it needs Causal and QOffsetInput.
	Mask *Tensor
	// KVHeads > 0 (op set v4) makes the node attention over the KVHeads KV heads of k and v
	// from KVHeadOffset on, k and v keeping their full shape: one part of an attention split
	// by heads across units. q holds the query heads of those KV heads (a multiple of
	// KVHeads), and the output has q's heads.
	KVHeadOffset, KVHeads int64
	// SoftCap > 0 (op set 5) caps every score s = Scale·q·k as SoftCap·tanh(s/SoftCap) before
	// the softmax (Gemma 2's attention logit soft-capping).
	SoftCap float32
	// Window > 0 (op set 5) is a sliding window: query i sees only the Window keys ending at
	// its own position, (i+q_offset-Window, i+q_offset]. It needs Causal and no Mask.
	Window int64
}

// Attention is fused scaled dot-product attention with grouped-query heads:
// q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv] → [Tq, Hq, Dv]. k and v may be F32, F16 or
// (op set 5) Q8_0 or Q4_0, a quantized KV cache.
func (g *Graph) Attention(q, k, v *Tensor, o AttentionOptions) *Tensor {
	in := []*Tensor{q, k, v}
	if o.QOffsetInput != nil {
		in = append(in, o.QOffsetInput)
	}
	if o.Mask != nil {
		if o.QOffsetInput == nil {
			// Without it the mask would land in q_offset's slot.
			name := g.nextName
			g.nextName = ""
			return g.fail(g.prefix+name, OpAttention, "a mask needs QOffsetInput (the 4th input)")
		}
		in = append(in, o.Mask)
	}
	s := g.spec(OpAttention, in...)
	s.fattr[0] = o.Scale
	if o.Causal {
		s.iattr[0] = 1
	}
	s.iattr[1] = o.QOffset
	s.iattr[2], s.iattr[3] = o.KVHeadOffset, o.KVHeads
	s.fattr[1], s.iattr[4] = o.SoftCap, o.Window
	return g.add(s)
}

// GetRows gathers rows of table [R, K] by ids (i32) → f32 [..., K].
func (g *Graph) GetRows(table, ids *Tensor) *Tensor { return g.add(g.spec(OpGetRows, table, ids)) }

// GetRowsI8 is GetRows of an I8 table whose values are scale*q.
func (g *Graph) GetRowsI8(table, ids *Tensor, scale float32) *Tensor {
	return g.addF(OpGetRows, scale, table, ids)
}

// Cast converts x to dt (F32, F16, BF16).
func (g *Graph) Cast(x *Tensor, dt DType) *Tensor {
	s := g.spec(OpCast, x)
	s.outDType = dt
	return g.add(s)
}

// Quantize converts f32 x to Q8_0, Q4_0, a K-quant or I8 (scale used for I8 only).
func (g *Graph) Quantize(x *Tensor, dt DType, scale float32) *Tensor {
	s := g.spec(OpQuantize, x)
	s.outDType = dt
	s.fattr[0] = scale
	return g.add(s)
}

// Dequantize converts Q8_0, Q4_0, a K-quant or I8 (with scale) to f32.
func (g *Graph) Dequantize(x *Tensor, scale float32) *Tensor {
	return g.addF(OpDequantize, scale, x)
}

// Reshape gives x a new shape with the same element count.
func (g *Graph) Reshape(x *Tensor, shape ...int64) *Tensor {
	s := g.spec(OpReshape, x)
	s.outShape = shape
	return g.add(s)
}

// Permute moves axes: out.shape[d] = x.shape[perm[d]].
func (g *Graph) Permute(x *Tensor, perm ...int64) *Tensor {
	s := g.spec(OpPermute, x)
	if len(perm) > MaxRank {
		return g.fail(s.name, OpPermute, "perm has %d axes, max %d", len(perm), MaxRank)
	}
	if x != nil && len(perm) != len(x.Shape) {
		return g.fail(s.name, OpPermute, "perm %v does not match rank %d", perm, len(x.Shape))
	}
	copy(s.iattr[:], perm)
	return g.add(s)
}

// Slice keeps [start, start+length) of axis.
func (g *Graph) Slice(x *Tensor, axis int, start, length int64) *Tensor {
	s := g.spec(OpSlice, x)
	s.iattr[0], s.iattr[1] = int64(axis), start
	if x != nil && axis >= 0 && axis < len(x.Shape) {
		s.outShape = x.Shape.Clone()
		s.outShape[axis] = length
	}
	return g.add(s)
}

// Concat joins tensors along axis (1 to 8 inputs).
func (g *Graph) Concat(axis int, xs ...*Tensor) *Tensor {
	s := g.spec(OpConcat, xs...)
	s.iattr[0] = int64(axis)
	return g.add(s)
}
