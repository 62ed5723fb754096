package core

// Op is an operation of op set v1. The values equal the IR's XPU_OP_* constants.
type Op uint32

// Op set v1; semantics in abi/OPS.md.
const (
	OpInvalid Op = iota
	OpAdd
	OpSub
	OpMul
	OpDiv
	OpSiLU
	OpGELU
	OpReLU
	OpExp
	OpNeg
	OpScale
	OpRMSNorm
	OpLayerNorm
	OpSoftmax
	OpMatMul
	OpRoPE
	OpAttention
	OpGetRows
	OpCast
	OpQuantize
	OpDequantize
	OpReshape
	OpPermute
	OpSlice
	OpConcat
	// OpShadowMatMul (op set 3) multiplies the part of an activation beyond a clip threshold
	// with float weight columns: mllm-NPU's shadow outlier path.
	OpShadowMatMul
	// OpSparseFFN (op set 3) is a feed-forward block over a list of neuron bundles, skipping
	// neurons whose activation is zero: PowerInfer-2's sparse FFN.
	OpSparseFFN
	// OpTanh (op set 5) is the hyperbolic tangent: Gemma 2's logit soft-cap is c·tanh(x/c).
	OpTanh
	opCount
)

// OpsetVersion is the newest op-set version this package knows (abi/OPS.md). A graph is written
// with the lowest version that holds it (Graph.Opset), so a plugin that knows only op set 1
// still runs every graph that uses nothing newer.
const OpsetVersion = 5

// Opset is the lowest op-set version that holds g: 5 where it uses TANH or an ATTENTION with a
// soft-cap, a sliding window or quantized K/V; 4 where an ATTENTION runs on a KV head range, 3 where it uses an op-set-3 op (SHADOW_MATMUL, SPARSE_FFN, a MATMUL with an I8 `a` or
// a per-channel scale input), 2 where it has a K-quant tensor or an ATTENTION with a mask
// input, else 1.
func (g *Graph) Opset() uint32 {
	v := uint32(1)
	for _, t := range g.Tensors {
		if t.DType.KQuant() {
			v = 2
		}
	}
	for _, n := range g.Nodes {
		if n.Op == OpTanh || n.Op == OpAttention && attentionV5(n) {
			return 5
		}
	}
	for _, n := range g.Nodes {
		switch {
		case n.Op == OpAttention && n.IAttr[3] != 0:
			return 4
		case n.Op == OpShadowMatMul || n.Op == OpSparseFFN:
			v = max(v, 3)
		case n.Op == OpMatMul && (len(n.Inputs) > 2 || len(n.Inputs) > 0 && n.Inputs[0] != nil && n.Inputs[0].DType == I8):
			v = max(v, 3)
		case n.Op == OpAttention && len(n.Inputs) > 4:
			v = max(v, 2)
		}
	}
	return v
}

var opNames = [...]string{"INVALID", "ADD", "SUB", "MUL", "DIV", "SILU", "GELU", "RELU", "EXP",
	"NEG", "SCALE", "RMS_NORM", "LAYER_NORM", "SOFTMAX", "MATMUL", "ROPE", "ATTENTION",
	"GET_ROWS", "CAST", "QUANTIZE", "DEQUANTIZE", "RESHAPE", "PERMUTE", "SLICE", "CONCAT", "SHADOW_MATMUL", "SPARSE_FFN",
	"TANH"}

// attentionV5 reports whether an ATTENTION node uses an op-set-5 addition: a soft-cap, a sliding
// window, or a quantized K or V.
func attentionV5(n *Node) bool {
	if n.FAttr[1] != 0 || n.IAttr[4] != 0 {
		return true
	}
	for _, t := range n.Inputs[1:min(3, len(n.Inputs))] {
		if t != nil && t.DType.Quantized() {
			return true
		}
	}
	return false
}

// AllOps lists every op of op set OpsetVersion in id order.
func AllOps() []Op {
	ops := make([]Op, 0, opCount-1)
	for o := OpAdd; o < opCount; o++ {
		ops = append(ops, o)
	}
	return ops
}

// String gives the op's name as in OPS.md, or op(N) for an unknown value.
func (o Op) String() string { return enumName(opNames[:], o, "op") }

// ParseOp reads a name as String writes it (case-insensitive).
func ParseOp(s string) (Op, error) { return parseEnum[Op](opNames[:], s, "op") }

// Elementwise reports whether o is a unary or binary elementwise op (incl. SCALE).
func (o Op) Elementwise() bool { return o >= OpAdd && o <= OpScale || o == OpTanh }

// Binary reports whether o is ADD, SUB, MUL or DIV.
func (o Op) Binary() bool { return o >= OpAdd && o <= OpDiv }

// RoPE modes (iattr[0]).
const (
	RoPENormal = 0
	RoPENeoX   = 2
)

// Attribute slots, as in xpu_ir.h.
const (
	MaxRank   = 4
	MaxInputs = 8
	MaxIAttr  = 8
	MaxFAttr  = 4
)
