package gguf

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// ValueType is a metadata value's type id, as in the GGUF specification.
type ValueType uint32

// Metadata value types.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string",
	"array", "u64", "i64", "f64"}

// String is the type name as the GGUF specification spells it (u8, string, array...).
func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// size is the encoded size of a scalar type; 0 for string and array (variable).
func (t ValueType) size() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// minSize is the fewest bytes one value of t can take in a file (used to bound counts before
// allocating).
func (t ValueType) minSize() int {
	switch t {
	case TypeString:
		return 8
	case TypeArray:
		return 12
	}
	return t.size()
}

// GGMLType is a tensor type id (enum ggml_type).
type GGMLType uint32

// The ggml tensor types this package maps; others are named in errors only.
const (
	GGMLTypeF32  GGMLType = 0
	GGMLTypeF16  GGMLType = 1
	GGMLTypeQ4_0 GGMLType = 2
	GGMLTypeQ8_0 GGMLType = 8
	GGMLTypeQ2_K GGMLType = 10
	GGMLTypeQ3_K GGMLType = 11
	GGMLTypeQ4_K GGMLType = 12
	GGMLTypeQ5_K GGMLType = 13
	GGMLTypeQ6_K GGMLType = 14
	GGMLTypeI32  GGMLType = 26
	GGMLTypeBF16 GGMLType = 30
	// GGMLTypeI8 is ggml's plain int8 tensor: codes only, the scale lives elsewhere (xpu's NPU
	// int8 weights keep theirs in a companion F32 tensor, see llm/w8a8).
	GGMLTypeI8 GGMLType = 24
)

// ggmlOf pairs each mapped ggml type with the core dtype of the same layout (one table for
// both directions).
var ggmlOf = map[GGMLType]core.DType{
	GGMLTypeF32: core.F32, GGMLTypeF16: core.F16, GGMLTypeBF16: core.BF16,
	GGMLTypeQ8_0: core.Q8_0, GGMLTypeQ4_0: core.Q4_0,
	GGMLTypeQ2_K: core.Q2_K, GGMLTypeQ3_K: core.Q3_K, GGMLTypeQ4_K: core.Q4_K,
	GGMLTypeQ5_K: core.Q5_K, GGMLTypeQ6_K: core.Q6_K, GGMLTypeI8: core.I8,
	GGMLTypeI32: core.I32, // index tensors (the sparse sidecar's neuron orders)
}

// ggmlTypeNames names every id ggml has used, so that an unsupported tensor is named in the error.
var ggmlTypeNames = map[GGMLType]string{
	0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 4: "Q4_2", 5: "Q4_3", 6: "Q5_0", 7: "Q5_1",
	8: "Q8_0", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
	16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
	22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
	29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}

// String is the ggml type name (F32, Q4_0, Q4_K...).
func (t GGMLType) String() string {
	if n, ok := ggmlTypeNames[t]; ok {
		return n
	}
	return fmt.Sprintf("ggml_type(%d)", uint32(t))
}

// DType maps a ggml type to the core dtype with the same layout, or fails naming the type.
func (t GGMLType) DType() (core.DType, error) {
	if dt, ok := ggmlOf[t]; ok {
		return dt, nil
	}
	return core.InvalidDType, fmt.Errorf("gguf: tensor type %s: %w", t, core.ErrUnsupported)
}

// TypeOf maps a core dtype to its ggml type id.
func TypeOf(dt core.DType) (GGMLType, error) {
	for t, d := range ggmlOf {
		if d == dt {
			return t, nil
		}
	}
	return 0, fmt.Errorf("gguf: dtype %s has no ggml type: %w", dt, core.ErrUnsupported)
}
