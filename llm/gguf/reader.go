// Package gguf reads and writes GGUF v2/v3 model files (the llama.cpp format): metadata,
// tensor infos and tensor data mapped from the file without copies.
package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"

	"github.com/xpuhub/xpu/core"
)

// Limits that keep a hostile file from causing unbounded work. Counts are also bounded by the
// bytes left in the file before anything is allocated.
const (
	MaxTensorDims   = 4
	MaxArrayDepth   = 8
	MaxTensorName   = 64 // GGML_MAX_NAME
	DefaultAlign    = 32
	MaxStringLength = 1 << 24
)

// ErrFormat wraps every error about a malformed file.
var ErrFormat = errors.New("gguf: malformed file")

// KeyValue is one metadata entry.
type KeyValue struct {
	Key   string
	Value Value
}

// TensorInfo describes one tensor.
type TensorInfo struct {
	Name  string
	Type  GGMLType
	DType core.DType
	// Dims is ne[] in file order: Dims[0] is the contiguous (row) axis.
	Dims []uint64
	// Shape is Dims outermost first, the core convention: a weight W[out][in] is [out, in].
	Shape core.Shape
	// Offset is relative to the start of the data section; Size is in bytes.
	Offset int64
	Size   int64
}

// File is a parsed GGUF file. Its tensor data aliases the mapped file: valid until Close.
type File struct {
	Version   uint32
	BigEndian bool
	Alignment int64
	// DataOffset is where the data section starts in the file.
	DataOffset int64
	KV         []KeyValue
	Tensors    []TensorInfo

	data    []byte
	kvIdx   map[string]int
	tIdx    map[string]int
	release func() error
	// detached and protected: see Detached and Protected (Open's mapping)
	detached  func() bool
	protected bool
	check     func() error
}

// Parse reads a GGUF image held in memory; data is not copied and must outlive the File.
func Parse(data []byte) (*File, error) {
	f := &File{data: data, kvIdx: map[string]int{}, tIdx: map[string]int{}, Alignment: DefaultAlign}
	if err := f.parse(); err != nil {
		return nil, err
	}
	return f, nil
}

// Close unmaps the file (when opened with Open). Tensor data must not be used afterwards.
func (f *File) Close() error {
	if f.release == nil {
		return nil
	}
	r := f.release
	f.release, f.data = nil, nil
	return r()
}

// Bytes is the whole file image.
func (f *File) Bytes() []byte { return f.data }

// Get returns a metadata value.
func (f *File) Get(key string) (Value, bool) {
	i, ok := f.kvIdx[key]
	if !ok {
		return Value{}, false
	}
	return f.KV[i].Value, true
}

// Tensor finds a tensor by name.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.tIdx[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// TensorData returns a tensor's bytes, in the file's byte order, without copying; nil for a
// TensorInfo that does not fit this file (one of another file, or edited).
func (f *File) TensorData(t *TensorInfo) []byte {
	start := f.DataOffset + t.Offset
	if t.Offset < 0 || t.Size < 0 || start > int64(len(f.data)) || t.Size > int64(len(f.data))-start {
		return nil
	}
	return f.data[start : start+t.Size : start+t.Size]
}

type cursor struct {
	b   []byte
	off int
	bo  binary.ByteOrder
}

func (c *cursor) errf(format string, args ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrFormat, c.off, fmt.Sprintf(format, args...))
}

func (c *cursor) left() int { return len(c.b) - c.off }

func (c *cursor) take(n int, what string) ([]byte, error) {
	if n < 0 || n > c.left() {
		return nil, c.errf("%s needs %d bytes, %d left", what, n, c.left())
	}
	p := c.b[c.off : c.off+n]
	c.off += n
	return p, nil
}

func (c *cursor) u32(what string) (uint32, error) {
	p, err := c.take(4, what)
	if err != nil {
		return 0, err
	}
	return c.bo.Uint32(p), nil
}

func (c *cursor) u64(what string) (uint64, error) {
	p, err := c.take(8, what)
	if err != nil {
		return 0, err
	}
	return c.bo.Uint64(p), nil
}

// count reads a u64 count of items of at least minSize bytes each and rejects counts the rest
// of the file cannot hold, so no allocation exceeds the file's size.
func (c *cursor) count(minSize int, what string) (int, error) {
	n, err := c.u64(what)
	if err != nil {
		return 0, err
	}
	if minSize < 1 {
		minSize = 1
	}
	if n > uint64(c.left()/minSize) {
		return 0, c.errf("%s %d exceeds what the %d remaining bytes can hold", what, n, c.left())
	}
	return int(n), nil
}

func (c *cursor) str(what string) (string, error) {
	n, err := c.u64(what + " length")
	if err != nil {
		return "", err
	}
	if n > MaxStringLength {
		return "", c.errf("%s length %d exceeds %d", what, n, MaxStringLength)
	}
	p, err := c.take(int(n), what)
	if err != nil {
		return "", err
	}
	return string(p), nil
}

func (f *File) parse() error {
	c := &cursor{b: f.data, bo: binary.LittleEndian}
	magic, err := c.take(4, "magic")
	if err != nil {
		return err
	}
	if string(magic) != "GGUF" {
		return fmt.Errorf("%w: bad magic %q (not a GGUF file)", ErrFormat, magic)
	}
	v, err := c.u32("version")
	if err != nil {
		return err
	}
	// ggml writes the magic as bytes in every byte order; only the version shows a swapped file.
	if v&0xFFFF == 0 {
		v = bits.ReverseBytes32(v)
		c.bo = binary.BigEndian
		f.BigEndian = true
	}
	f.Version = v
	if v < 2 || v > 3 {
		return fmt.Errorf("gguf: version %d (this reader takes 2 and 3): %w", v, core.ErrIncompatible)
	}
	nT, err := c.count(8+4+4+8, "tensor count")
	if err != nil {
		return err
	}
	nKV, err := c.count(8+4+1, "metadata count")
	if err != nil {
		return err
	}
	f.KV = make([]KeyValue, 0, nKV)
	for i := 0; i < nKV; i++ {
		key, err := c.str("key")
		if err != nil {
			return err
		}
		if _, dup := f.kvIdx[key]; dup {
			return c.errf("duplicate key %q", key)
		}
		t, err := c.u32("value type of " + key)
		if err != nil {
			return err
		}
		val, err := c.value(ValueType(t), 0)
		if err != nil {
			return fmt.Errorf("key %q: %w", key, err)
		}
		f.kvIdx[key] = len(f.KV)
		f.KV = append(f.KV, KeyValue{Key: key, Value: val})
	}
	if av, ok := f.Get("general.alignment"); ok {
		a, isU32 := av.Any().(uint32)
		if !isU32 || a == 0 || a&(a-1) != 0 {
			return fmt.Errorf("%w: general.alignment must be a u32 power of two, got %s %v",
				ErrFormat, av.Type, av.Any())
		}
		f.Alignment = int64(a)
	}
	f.Tensors = make([]TensorInfo, 0, nT)
	for i := 0; i < nT; i++ {
		t, err := c.tensorInfo()
		if err != nil {
			return fmt.Errorf("tensor %d: %w", i, err)
		}
		if _, dup := f.tIdx[t.Name]; dup {
			return c.errf("duplicate tensor %q", t.Name)
		}
		f.tIdx[t.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, t)
	}
	f.DataOffset = alignUp(int64(c.off), f.Alignment)
	if nT > 0 && f.DataOffset > int64(len(f.data)) {
		return fmt.Errorf("%w: data section at %d is past the end of the file (%d bytes)",
			ErrFormat, f.DataOffset, len(f.data))
	}
	dataLen := int64(len(f.data)) - f.DataOffset
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if t.Offset%f.Alignment != 0 {
			return fmt.Errorf("%w: tensor %q offset %d is not a multiple of the alignment %d",
				ErrFormat, t.Name, t.Offset, f.Alignment)
		}
		if t.Offset > dataLen || t.Size > dataLen-t.Offset {
			return fmt.Errorf("%w: tensor %q [%d, +%d) runs past the data section (%d bytes)",
				ErrFormat, t.Name, t.Offset, t.Size, dataLen)
		}
	}
	return nil
}

func alignUp(x, a int64) int64 { return (x + a - 1) / a * a }

func (c *cursor) tensorInfo() (TensorInfo, error) {
	var t TensorInfo
	name, err := c.str("tensor name")
	if err != nil {
		return t, err
	}
	if len(name) >= MaxTensorName {
		return t, c.errf("tensor name %q is %d bytes (max %d)", name, len(name), MaxTensorName-1)
	}
	t.Name = name
	nd, err := c.u32("n_dims")
	if err != nil {
		return t, err
	}
	if nd > MaxTensorDims {
		return t, c.errf("tensor %q has %d dims (max %d)", name, nd, MaxTensorDims)
	}
	t.Dims = make([]uint64, nd)
	elems := uint64(1)
	for d := range t.Dims {
		if t.Dims[d], err = c.u64("dim"); err != nil {
			return t, err
		}
		hi, lo := bits.Mul64(elems, t.Dims[d])
		if hi != 0 || lo > math.MaxInt64/64 {
			return t, c.errf("tensor %q: element count overflows", name)
		}
		elems = lo
	}
	ty, err := c.u32("tensor type")
	if err != nil {
		return t, err
	}
	t.Type = GGMLType(ty)
	if t.DType, err = t.Type.DType(); err != nil {
		return t, fmt.Errorf("tensor %q: %w", name, err)
	}
	off, err := c.u64("tensor offset")
	if err != nil {
		return t, err
	}
	if off > math.MaxInt64/2 {
		return t, c.errf("tensor %q offset %d out of range", name, off)
	}
	t.Offset = int64(off)
	bl := uint64(t.DType.BlockLen())
	if nd > 0 && t.Dims[0]%bl != 0 {
		return t, c.errf("tensor %q: row length %d is not a multiple of the %s block (%d)",
			name, t.Dims[0], t.DType, bl)
	}
	if nd == 0 && bl > 1 {
		return t, c.errf("tensor %q: a %s scalar is impossible", name, t.DType)
	}
	t.Size = t.DType.Bytes(int64(elems))
	t.Shape = make(core.Shape, nd)
	for d := range t.Dims {
		t.Shape[int(nd)-1-d] = int64(t.Dims[d])
	}
	return t, nil
}

func (c *cursor) value(t ValueType, depth int) (Value, error) {
	if sz := t.size(); sz > 0 {
		p, err := c.take(sz, t.String())
		if err != nil {
			return Value{}, err
		}
		return c.scalar(t, p)
	}
	switch t {
	case TypeString:
		s, err := c.str("string")
		return Value{Type: TypeString, v: s}, err
	case TypeArray:
		if depth >= MaxArrayDepth {
			return Value{}, c.errf("arrays nested deeper than %d", MaxArrayDepth)
		}
		et, err := c.u32("array element type")
		if err != nil {
			return Value{}, err
		}
		elem := ValueType(et)
		if elem.minSize() == 0 {
			return Value{}, c.errf("unknown array element type %d", et)
		}
		n, err := c.count(elem.minSize(), "array length")
		if err != nil {
			return Value{}, err
		}
		return c.array(elem, n, depth)
	}
	return Value{}, c.errf("unknown value type %d", uint32(t))
}

func (c *cursor) scalar(t ValueType, p []byte) (Value, error) {
	v := Value{Type: t}
	switch t {
	case TypeUint8:
		v.v = p[0]
	case TypeInt8:
		v.v = int8(p[0])
	case TypeBool:
		if p[0] > 1 {
			return v, c.errf("bool value %d (must be 0 or 1)", p[0])
		}
		v.v = p[0] == 1
	case TypeUint16:
		v.v = c.bo.Uint16(p)
	case TypeInt16:
		v.v = int16(c.bo.Uint16(p))
	case TypeUint32:
		v.v = c.bo.Uint32(p)
	case TypeInt32:
		v.v = int32(c.bo.Uint32(p))
	case TypeFloat32:
		v.v = math.Float32frombits(c.bo.Uint32(p))
	case TypeUint64:
		v.v = c.bo.Uint64(p)
	case TypeInt64:
		v.v = int64(c.bo.Uint64(p))
	case TypeFloat64:
		v.v = math.Float64frombits(c.bo.Uint64(p))
	}
	return v, nil
}

func (c *cursor) array(elem ValueType, n, depth int) (Value, error) {
	v := Value{Type: TypeArray, Elem: elem}
	sz := elem.size()
	if sz > 0 {
		p, err := c.take(n*sz, "array")
		if err != nil {
			return v, err
		}
		v.v, err = c.decodeScalars(elem, p, n)
		return v, err
	}
	switch elem {
	case TypeString:
		out := make([]string, n)
		for i := range out {
			s, err := c.str("array string")
			if err != nil {
				return v, err
			}
			out[i] = s
		}
		v.v = out
	case TypeArray:
		out := make([]Value, n)
		for i := range out {
			sub, err := c.value(TypeArray, depth+1)
			if err != nil {
				return v, err
			}
			out[i] = sub
		}
		v.v = out
	}
	return v, nil
}

func (c *cursor) decodeScalars(elem ValueType, p []byte, n int) (any, error) {
	bo := c.bo
	switch elem {
	case TypeUint8:
		return append([]uint8(nil), p...), nil
	case TypeInt8:
		out := make([]int8, n)
		for i := range out {
			out[i] = int8(p[i])
		}
		return out, nil
	case TypeBool:
		out := make([]bool, n)
		for i := range out {
			if p[i] > 1 {
				return nil, c.errf("bool array element %d is %d", i, p[i])
			}
			out[i] = p[i] == 1
		}
		return out, nil
	case TypeUint16:
		out := make([]uint16, n)
		for i := range out {
			out[i] = bo.Uint16(p[2*i:])
		}
		return out, nil
	case TypeInt16:
		out := make([]int16, n)
		for i := range out {
			out[i] = int16(bo.Uint16(p[2*i:]))
		}
		return out, nil
	case TypeUint32:
		out := make([]uint32, n)
		for i := range out {
			out[i] = bo.Uint32(p[4*i:])
		}
		return out, nil
	case TypeInt32:
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(bo.Uint32(p[4*i:]))
		}
		return out, nil
	case TypeFloat32:
		out := make([]float32, n)
		for i := range out {
			out[i] = math.Float32frombits(bo.Uint32(p[4*i:]))
		}
		return out, nil
	case TypeUint64:
		out := make([]uint64, n)
		for i := range out {
			out[i] = bo.Uint64(p[8*i:])
		}
		return out, nil
	case TypeInt64:
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(bo.Uint64(p[8*i:]))
		}
		return out, nil
	case TypeFloat64:
		out := make([]float64, n)
		for i := range out {
			out[i] = math.Float64frombits(bo.Uint64(p[8*i:]))
		}
		return out, nil
	}
	return nil, c.errf("array of %s", elem)
}
