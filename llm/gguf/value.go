package gguf

import (
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
)

// Value is one metadata value. Scalars hold the Go type of their GGUF type (uint8 ... float64,
// bool, string); arrays hold a typed slice ([]uint32, []string, ...) or, for nested arrays,
// []Value.
type Value struct {
	Type ValueType
	Elem ValueType // element type when Type is TypeArray
	v    any
}

// NewValue wraps a Go value: the scalar types, string, their slices (an array) or []Value.
func NewValue(v any) (Value, error) {
	switch x := v.(type) {
	case uint8:
		return Value{Type: TypeUint8, v: x}, nil
	case int8:
		return Value{Type: TypeInt8, v: x}, nil
	case uint16:
		return Value{Type: TypeUint16, v: x}, nil
	case int16:
		return Value{Type: TypeInt16, v: x}, nil
	case uint32:
		return Value{Type: TypeUint32, v: x}, nil
	case int32:
		return Value{Type: TypeInt32, v: x}, nil
	case float32:
		return Value{Type: TypeFloat32, v: x}, nil
	case bool:
		return Value{Type: TypeBool, v: x}, nil
	case string:
		return Value{Type: TypeString, v: x}, nil
	case uint64:
		return Value{Type: TypeUint64, v: x}, nil
	case int64:
		return Value{Type: TypeInt64, v: x}, nil
	case float64:
		return Value{Type: TypeFloat64, v: x}, nil
	case []uint8:
		return Value{Type: TypeArray, Elem: TypeUint8, v: x}, nil
	case []int8:
		return Value{Type: TypeArray, Elem: TypeInt8, v: x}, nil
	case []uint16:
		return Value{Type: TypeArray, Elem: TypeUint16, v: x}, nil
	case []int16:
		return Value{Type: TypeArray, Elem: TypeInt16, v: x}, nil
	case []uint32:
		return Value{Type: TypeArray, Elem: TypeUint32, v: x}, nil
	case []int32:
		return Value{Type: TypeArray, Elem: TypeInt32, v: x}, nil
	case []float32:
		return Value{Type: TypeArray, Elem: TypeFloat32, v: x}, nil
	case []bool:
		return Value{Type: TypeArray, Elem: TypeBool, v: x}, nil
	case []string:
		return Value{Type: TypeArray, Elem: TypeString, v: x}, nil
	case []uint64:
		return Value{Type: TypeArray, Elem: TypeUint64, v: x}, nil
	case []int64:
		return Value{Type: TypeArray, Elem: TypeInt64, v: x}, nil
	case []float64:
		return Value{Type: TypeArray, Elem: TypeFloat64, v: x}, nil
	case []Value:
		return Value{Type: TypeArray, Elem: TypeArray, v: x}, nil
	}
	return Value{}, fmt.Errorf("gguf: no metadata type for Go type %T: %w", v, core.ErrInvalidArgument)
}

// MustValue is NewValue for values known to be valid; it panics otherwise (programming error).
func MustValue(v any) Value {
	val, err := NewValue(v)
	if err != nil {
		panic(err)
	}
	return val
}

// Any returns the Go value.
func (v Value) Any() any { return v.v }

// Len is the element count of an array, 0 for scalars.
func (v Value) Len() int {
	switch x := v.v.(type) {
	case []uint8:
		return len(x)
	case []int8:
		return len(x)
	case []uint16:
		return len(x)
	case []int16:
		return len(x)
	case []uint32:
		return len(x)
	case []int32:
		return len(x)
	case []float32:
		return len(x)
	case []bool:
		return len(x)
	case []string:
		return len(x)
	case []uint64:
		return len(x)
	case []int64:
		return len(x)
	case []float64:
		return len(x)
	case []Value:
		return len(x)
	}
	return 0
}

// Int returns an integer scalar of any width as int64; ok is false for other types and for
// u64 values above MaxInt64.
func (v Value) Int() (int64, bool) {
	switch x := v.v.(type) {
	case uint8:
		return int64(x), true
	case int8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case int16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case int32:
		return int64(x), true
	case uint64:
		if x > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	case int64:
		return x, true
	}
	return 0, false
}

// Float returns a float or integer scalar as float64.
func (v Value) Float() (float64, bool) {
	switch x := v.v.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	if i, ok := v.Int(); ok {
		return float64(i), true
	}
	return 0, false
}

// String returns a string scalar; for other values it formats them (fmt.Stringer).
func (v Value) String() string {
	if s, ok := v.v.(string); ok {
		return s
	}
	if v.Type == TypeArray {
		return fmt.Sprintf("[%s × %d]", v.Elem, v.Len())
	}
	return fmt.Sprint(v.v)
}

// Str returns a string scalar.
func (v Value) Str() (string, bool) {
	s, ok := v.v.(string)
	return s, ok
}

// Bool returns a bool scalar.
func (v Value) Bool() (bool, bool) {
	b, ok := v.v.(bool)
	return b, ok
}

// Strings returns a string array.
func (v Value) Strings() ([]string, bool) {
	s, ok := v.v.([]string)
	return s, ok
}

// Float32s returns an f32 array.
func (v Value) Float32s() ([]float32, bool) {
	s, ok := v.v.([]float32)
	return s, ok
}

// Ints returns an array of any integer type as int64s.
func (v Value) Ints() ([]int64, bool) {
	conv := func(n int, at func(int) int64) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = at(i)
		}
		return out
	}
	switch x := v.v.(type) {
	case []uint8:
		return conv(len(x), func(i int) int64 { return int64(x[i]) }), true
	case []int8:
		return conv(len(x), func(i int) int64 { return int64(x[i]) }), true
	case []uint16:
		return conv(len(x), func(i int) int64 { return int64(x[i]) }), true
	case []int16:
		return conv(len(x), func(i int) int64 { return int64(x[i]) }), true
	case []uint32:
		return conv(len(x), func(i int) int64 { return int64(x[i]) }), true
	case []int32:
		return conv(len(x), func(i int) int64 { return int64(x[i]) }), true
	case []uint64:
		return conv(len(x), func(i int) int64 { return int64(x[i]) }), true
	case []int64:
		return x, true
	}
	return nil, false
}
