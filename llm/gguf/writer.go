package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"

	"github.com/xpuhub/xpu/core"
)

// WriteTensor is one tensor to write. Shape is outermost first (core order). Either Data holds
// the bytes, or Gen produces them when the writer reaches the tensor, so a large model is never
// held in memory at once.
type WriteTensor struct {
	Name  string
	DType core.DType
	Shape core.Shape
	Data  []byte
	Gen   func() ([]byte, error)
}

// Write writes a little-endian GGUF v3 file: the metadata kvs in order, then the tensor infos,
// then the data, each tensor aligned to general.alignment (32 unless kvs set it).
func Write(w io.Writer, kvs []KeyValue, tensors []WriteTensor) error {
	align := int64(DefaultAlign)
	for _, kv := range kvs {
		if kv.Key == "general.alignment" {
			a, ok := kv.Value.Any().(uint32)
			if !ok || a == 0 || a&(a-1) != 0 {
				return fmt.Errorf("gguf: general.alignment must be a u32 power of two: %w", core.ErrInvalidArgument)
			}
			align = int64(a)
		}
	}
	bw := &ewriter{w: bufio.NewWriterSize(w, 1<<20)}
	bw.bytes([]byte("GGUF"))
	bw.u32(3)
	bw.u64(uint64(len(tensors)))
	bw.u64(uint64(len(kvs)))
	for _, kv := range kvs {
		bw.str(kv.Key)
		bw.u32(uint32(kv.Value.Type))
		if err := bw.value(kv.Value); err != nil {
			return fmt.Errorf("gguf: key %q: %w", kv.Key, err)
		}
	}
	var off int64
	for _, t := range tensors {
		ty, err := TypeOf(t.DType)
		if err != nil {
			return fmt.Errorf("gguf: tensor %q: %w", t.Name, err)
		}
		if len(t.Shape) > MaxTensorDims || len(t.Name) >= MaxTensorName {
			return fmt.Errorf("gguf: tensor %q: name or rank too long: %w", t.Name, core.ErrInvalidArgument)
		}
		bw.str(t.Name)
		bw.u32(uint32(len(t.Shape)))
		for d := len(t.Shape) - 1; d >= 0; d-- {
			bw.u64(uint64(t.Shape[d]))
		}
		bw.u32(uint32(ty))
		bw.u64(uint64(off))
		off = alignUp(off+tensorBytes(t), align)
	}
	bw.pad(align)
	for _, t := range tensors {
		data := t.Data
		if t.Gen != nil {
			var err error
			if data, err = t.Gen(); err != nil {
				return fmt.Errorf("gguf: tensor %q: %w", t.Name, err)
			}
		}
		if int64(len(data)) != tensorBytes(t) {
			return fmt.Errorf("gguf: tensor %q: %d bytes for %s%s, want %d: %w", t.Name, len(data),
				t.DType, t.Shape, tensorBytes(t), core.ErrInvalidArgument)
		}
		bw.bytes(data)
		bw.pad(align)
	}
	if bw.err != nil {
		return fmt.Errorf("gguf: write: %w", bw.err)
	}
	if err := bw.w.Flush(); err != nil {
		return fmt.Errorf("gguf: write: %w", err)
	}
	return nil
}

func tensorBytes(t WriteTensor) int64 { return t.DType.Bytes(t.Shape.NumElements()) }

// ewriter keeps the first error so the format code reads straight.
type ewriter struct {
	w   *bufio.Writer
	n   int64
	err error
	tmp [8]byte
}

func (e *ewriter) bytes(p []byte) {
	if e.err != nil {
		return
	}
	var n int
	n, e.err = e.w.Write(p)
	e.n += int64(n)
}

func (e *ewriter) u32(v uint32) {
	binary.LittleEndian.PutUint32(e.tmp[:4], v)
	e.bytes(e.tmp[:4])
}

func (e *ewriter) u64(v uint64) {
	binary.LittleEndian.PutUint64(e.tmp[:8], v)
	e.bytes(e.tmp[:8])
}

func (e *ewriter) str(s string) {
	e.u64(uint64(len(s)))
	e.bytes([]byte(s))
}

func (e *ewriter) pad(align int64) {
	if r := e.n % align; r != 0 {
		e.bytes(make([]byte, align-r))
	}
}

func (e *ewriter) value(v Value) error {
	if v.Type != TypeArray {
		return e.scalar(v.Any())
	}
	e.u32(uint32(v.Elem))
	e.u64(uint64(v.Len()))
	switch x := v.Any().(type) {
	case []string:
		for _, s := range x {
			e.str(s)
		}
	case []Value:
		for _, sub := range x {
			if sub.Type != TypeArray {
				return fmt.Errorf("nested array element of type %s: %w", sub.Type, core.ErrInvalidArgument)
			}
			if err := e.value(sub); err != nil {
				return err
			}
		}
	case []uint8:
		e.bytes(x)
	case []int8:
		for _, y := range x {
			e.bytes([]byte{byte(y)})
		}
	case []bool:
		for _, y := range x {
			e.scalar(y) //nolint:errcheck // bool never fails
		}
	case []uint16:
		for _, y := range x {
			e.scalar(y) //nolint:errcheck
		}
	case []int16:
		for _, y := range x {
			e.scalar(y) //nolint:errcheck
		}
	case []uint32:
		for _, y := range x {
			e.u32(y)
		}
	case []int32:
		for _, y := range x {
			e.u32(uint32(y))
		}
	case []float32:
		for _, y := range x {
			e.u32(math.Float32bits(y))
		}
	case []uint64:
		for _, y := range x {
			e.u64(y)
		}
	case []int64:
		for _, y := range x {
			e.u64(uint64(y))
		}
	case []float64:
		for _, y := range x {
			e.u64(math.Float64bits(y))
		}
	default:
		return fmt.Errorf("array of %T: %w", x, core.ErrInvalidArgument)
	}
	return nil
}

func (e *ewriter) scalar(v any) error {
	switch x := v.(type) {
	case uint8:
		e.bytes([]byte{x})
	case int8:
		e.bytes([]byte{byte(x)})
	case bool:
		b := byte(0)
		if x {
			b = 1
		}
		e.bytes([]byte{b})
	case uint16:
		binary.LittleEndian.PutUint16(e.tmp[:2], x)
		e.bytes(e.tmp[:2])
	case int16:
		binary.LittleEndian.PutUint16(e.tmp[:2], uint16(x))
		e.bytes(e.tmp[:2])
	case uint32:
		e.u32(x)
	case int32:
		e.u32(uint32(x))
	case float32:
		e.u32(math.Float32bits(x))
	case string:
		e.str(x)
	case uint64:
		e.u64(x)
	case int64:
		e.u64(uint64(x))
	case float64:
		e.u64(math.Float64bits(x))
	default:
		return fmt.Errorf("scalar of %T: %w", v, core.ErrInvalidArgument)
	}
	return nil
}
