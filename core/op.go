package core

import (
	"fmt"
	"strings"
)

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
	opCount
)

// OpsetVersion is the op-set version this package writes: 2 since the K-quant dtypes and
// ATTENTION's mask (abi/OPS.md), equal to the ABI's XPU_OPSET_VERSION. A plugin whose
// get_info range stops at 1 predates them and is told apart by conformance's probe-info case.
const OpsetVersion = 2

var opNames = [...]string{"INVALID", "ADD", "SUB", "MUL", "DIV", "SILU", "GELU", "RELU", "EXP",
	"NEG", "SCALE", "RMS_NORM", "LAYER_NORM", "SOFTMAX", "MATMUL", "ROPE", "ATTENTION",
	"GET_ROWS", "CAST", "QUANTIZE", "DEQUANTIZE", "RESHAPE", "PERMUTE", "SLICE", "CONCAT"}

// AllOps lists every v1 op in id order.
func AllOps() []Op {
	ops := make([]Op, 0, opCount-1)
	for o := OpAdd; o < opCount; o++ {
		ops = append(ops, o)
	}
	return ops
}

// String gives the op's name as in OPS.md, or op(N) for an unknown value.
func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint32(o))
}

// ParseOp reads a name as String writes it (case-insensitive).
func ParseOp(s string) (Op, error) {
	for i, n := range opNames[1:] {
		if strings.EqualFold(n, s) {
			return Op(i + 1), nil
		}
	}
	return OpInvalid, fmt.Errorf("op %q: %w", s, ErrNotFound)
}

// Elementwise reports whether o is a unary or binary elementwise op (incl. SCALE).
func (o Op) Elementwise() bool { return o >= OpAdd && o <= OpScale }

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
