package core

// DType is an element type. The values equal the ABI's XPU_DT_* constants.
type DType uint32

// The data types of op set v1. Q8_0 and Q4_0 are GGUF's block layouts, bit for bit.
const (
	InvalidDType DType = 0
	F32          DType = 1
	F16          DType = 2
	BF16         DType = 3
	I32          DType = 4
	I8           DType = 5
	Q8_0         DType = 6
	Q4_0         DType = 7
	// Op set v2: GGUF K-quants, super-blocks of QKK values, bit for bit.
	Q4_K DType = 8
	Q5_K DType = 9
	Q6_K DType = 10
	Q2_K DType = 11
	Q3_K DType = 12
)

// QK is the number of values in one Q8_0 or Q4_0 block.
const QK = 32

// QKK is the number of values in one K-quant super-block (Q2_K…Q6_K).
const QKK = 256

var dtypeNames = [...]string{"invalid", "f32", "f16", "bf16", "i32", "i8", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q2_k", "q3_k"}

// AllDTypes lists every valid dtype in id order.
var AllDTypes = []DType{F32, F16, BF16, I32, I8, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K}

// String gives the dtype's name as in OPS.md, or dtype(N) for an unknown value.
func (d DType) String() string { return enumName(dtypeNames[:], d, "dtype") }

// ParseDType reads a name as String writes it (case-insensitive).
func ParseDType(s string) (DType, error) { return parseEnum[DType](dtypeNames[:], s, "dtype") }

// Valid reports whether d is one of the op set's dtypes.
func (d DType) Valid() bool { return d >= F32 && d <= Q3_K }

// KQuant reports whether d is a K-quant (super-blocks of QKK values).
func (d DType) KQuant() bool { return d >= Q4_K && d <= Q3_K }

// BlockLen is the number of values in one block: 32 for Q8_0/Q4_0, 256 for the K-quants, 1
// otherwise.
func (d DType) BlockLen() int64 {
	switch {
	case d == Q8_0 || d == Q4_0:
		return QK
	case d.KQuant():
		return QKK
	}
	return 1
}

// BlockBytes is the size of one block in bytes.
func (d DType) BlockBytes() int64 {
	switch d {
	case F32, I32:
		return 4
	case F16, BF16:
		return 2
	case I8:
		return 1
	case Q8_0:
		return 34
	case Q4_0:
		return 18
	case Q4_K:
		return 144
	case Q5_K:
		return 176
	case Q6_K:
		return 210
	case Q2_K:
		return 84
	case Q3_K:
		return 110
	}
	return 0
}

// Quantized reports whether d is a block-quantized type (Q8_0, Q4_0, the K-quants).
func (d DType) Quantized() bool { return d == Q8_0 || d == Q4_0 || d.KQuant() }

// Float reports whether d is an activation dtype (F32 or F16).
func (d DType) Float() bool { return d == F32 || d == F16 }

// Bytes is the storage size of n values of d; n must be a multiple of BlockLen.
func (d DType) Bytes(n int64) int64 { return n / d.BlockLen() * d.BlockBytes() }
