package coreml

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/xpuhub/xpu/core"
)

// MIL data types (MIL.proto DataType).
type milType int

const (
	milBool milType = 1
	milStr  milType = 2
	milF16  milType = 10
	milF32  milType = 11
	milI32  milType = 23
)

// Targets: every package is an ML Program for iOS 16 / macOS 13 (specification version 7, opset
// CoreML6), the first release with Float16 multi-array inputs and outputs.
const (
	specVersion = 7
	opsetName   = "CoreML6"
	funcName    = "main"
	// WeightFile is where const ops' blob values point (Core ML resolves @model_path).
	weightFile = "@model_path/weights/weight.bin"
	// blobThreshold: float constants with more elements than this go to weight.bin.
	blobThreshold = 16
)

// negBig stands in for -inf in masked scores: a masked row that is fully masked then gives a
// finite uniform softmax that the 0/1 mask multiplies to zero, where -inf would give NaN.
const negBig = -3e38

// mvar is a MIL value: a function input or an operation output.
type mvar struct {
	name  string
	dt    milType
	shape []int64
}

// builder accumulates one MIL function.
type builder struct {
	ops   []msg
	next  int
	blob  *blobWriter
	names map[string]bool
}

func newBuilder() *builder {
	return &builder{blob: newBlobWriter(), names: map[string]bool{}}
}

func (b *builder) fresh(base string) string {
	b.next++
	return fmt.Sprintf("%s_%d", base, b.next)
}

func tensorType(dt milType, shape []int64) msg {
	tt := msg(nil).varint(fTensorDataType, uint64(dt)).varint(fTensorRank, uint64(len(shape)))
	for _, d := range shape {
		tt = tt.bytes(fTensorDims, msg(nil).bytes(fDimConstant, msg(nil).varint(fConstSize, uint64(d))))
	}
	return msg(nil).bytes(fValueTypeTensor, tt)
}

func namedType(v mvar) msg {
	return msg(nil).str(fNVTName, v.name).bytes(fNVTType, tensorType(v.dt, v.shape))
}

// arg is one named parameter of an operation, bound to one or more values.
type arg struct {
	name string
	vals []mvar
}

// op appends an operation with one output and returns that output.
func (b *builder) op(typ string, args []arg, dt milType, shape []int64) mvar {
	out := mvar{name: b.fresh(typ), dt: dt, shape: append([]int64(nil), shape...)}
	m := msg(nil).str(fOpType, typ)
	for _, a := range args {
		var am msg
		for _, v := range a.vals {
			am = am.bytes(fArgArguments, msg(nil).str(fBindName, v.name))
		}
		m = m.mapEntry(fOpInputs, a.name, am)
	}
	m = m.bytes(fOpOutputs, namedType(out))
	b.ops = append(b.ops, m)
	return out
}

// constOp appends a const operation whose value is val (an encoded Value without its type).
func (b *builder) constOp(dt milType, shape []int64, val msg) mvar {
	out := mvar{name: b.fresh("const"), dt: dt, shape: append([]int64(nil), shape...)}
	val = append(msg(nil).bytes(fValueType, tensorType(dt, shape)), val...)
	nameVal := msg(nil).bytes(fValueType, tensorType(milStr, nil)).bytes(fValueImmediate,
		msg(nil).bytes(fImmTensor, msg(nil).bytes(fTVStrings, msg(nil).str(1, out.name))))
	m := msg(nil).str(fOpType, "const").bytes(fOpOutputs, namedType(out)).
		mapEntry(fOpAttributes, "name", nameVal).mapEntry(fOpAttributes, "val", val)
	b.ops = append(b.ops, m)
	return out
}

func immediate(tv msg) msg { return msg(nil).bytes(fValueImmediate, msg(nil).bytes(fImmTensor, tv)) }

func (b *builder) constInts(shape []int64, xs []int64) mvar {
	return b.constOp(milI32, shape, immediate(msg(nil).bytes(fTVInts, msg(nil).bytes(1, packedVarints(xs)))))
}

func (b *builder) intScalar(x int64) mvar { return b.constInts(nil, []int64{x}) }

func (b *builder) intVec(xs ...int64) mvar { return b.constInts([]int64{int64(len(xs))}, xs) }

func (b *builder) boolScalar(v bool) mvar {
	x := uint64(0)
	if v {
		x = 1
	}
	return b.constOp(milBool, nil, immediate(msg(nil).bytes(fTVBools, msg(nil).bytes(1, protowireVarint(x)))))
}

func (b *builder) boolTensor(shape []int64, xs []bool) mvar {
	var p []byte
	for _, x := range xs {
		if x {
			p = append(p, 1)
		} else {
			p = append(p, 0)
		}
	}
	return b.constOp(milBool, shape, immediate(msg(nil).bytes(fTVBools, msg(nil).bytes(1, p))))
}

func (b *builder) strScalar(s string) mvar {
	return b.constOp(milStr, nil, immediate(msg(nil).bytes(fTVStrings, msg(nil).str(1, s))))
}

// floats adds a float constant of dtype dt: small ones inline, the rest in weight.bin. key
// identifies shared source bytes (a graph constant) so that they are written once.
func (b *builder) floats(dt milType, shape []int64, xs []float32, key any) mvar {
	if len(xs) <= blobThreshold && dt == milF32 {
		return b.constOp(dt, shape, immediate(msg(nil).bytes(fTVFloats, msg(nil).bytes(1, packedFloats(xs)))))
	}
	off := b.blob.add(dt, xs, key)
	return b.constOp(dt, shape, msg(nil).bytes(fValueBlob, msg(nil).str(fBlobFileName, weightFile).varint(fBlobOffset, off)))
}

func (b *builder) scalar(dt milType, x float32) mvar {
	if dt == milF16 {
		// an f16 immediate is stored as bytes; one scalar is simpler as an f32 const cast once
		return b.cast(b.floats(milF32, nil, []float32{x}, nil), milF16)
	}
	return b.floats(dt, nil, []float32{x}, nil)
}

func milName(dt milType) string {
	switch dt {
	case milF16:
		return "fp16"
	case milF32:
		return "fp32"
	case milI32:
		return "int32"
	case milBool:
		return "bool"
	}
	return "?"
}

func (b *builder) cast(x mvar, dt milType) mvar {
	if x.dt == dt {
		return x
	}
	return b.op("cast", []arg{{"x", []mvar{x}}, {"dtype", []mvar{b.strScalar(milName(dt))}}}, dt, x.shape)
}

func (b *builder) binary(typ string, x, y mvar, shape []int64) mvar {
	dt := x.dt
	if typ == "less_equal" {
		dt = milBool
	}
	return b.op(typ, []arg{{"x", []mvar{x}}, {"y", []mvar{y}}}, dt, shape)
}

func (b *builder) unary(typ string, x mvar) mvar {
	return b.op(typ, []arg{{"x", []mvar{x}}}, x.dt, x.shape)
}

func (b *builder) reshape(x mvar, shape []int64) mvar {
	return b.op("reshape", []arg{{"x", []mvar{x}}, {"shape", []mvar{b.intVec(shape...)}}}, x.dt, shape)
}

func (b *builder) transpose(x mvar, perm []int64) mvar {
	shape := make([]int64, len(perm))
	for i, p := range perm {
		shape[i] = x.shape[p]
	}
	return b.op("transpose", []arg{{"x", []mvar{x}}, {"perm", []mvar{b.intVec(perm...)}}}, x.dt, shape)
}

// slice takes [lo, hi) along axis, the other axes whole.
func (b *builder) slice(x mvar, axis int, lo, hi int64) mvar {
	begin := make([]int64, len(x.shape))
	end := append([]int64(nil), x.shape...)
	begin[axis], end[axis] = lo, hi
	shape := append([]int64(nil), x.shape...)
	shape[axis] = hi - lo
	return b.op("slice_by_index", []arg{{"x", []mvar{x}}, {"begin", []mvar{b.intVec(begin...)}},
		{"end", []mvar{b.intVec(end...)}}}, x.dt, shape)
}

func (b *builder) concat(xs []mvar, axis int) mvar {
	shape := append([]int64(nil), xs[0].shape...)
	shape[axis] = 0
	for _, x := range xs {
		shape[axis] += x.shape[axis]
	}
	return b.op("concat", []arg{{"values", xs}, {"axis", []mvar{b.intScalar(int64(axis))}},
		{"interleave", []mvar{b.boolScalar(false)}}}, xs[0].dt, shape)
}

func (b *builder) matmul(x, y mvar, transposeY bool, shape []int64) mvar {
	return b.op("matmul", []arg{{"x", []mvar{x}}, {"y", []mvar{y}}, {"transpose_x", []mvar{b.boolScalar(false)}},
		{"transpose_y", []mvar{b.boolScalar(transposeY)}}}, x.dt, shape)
}

func (b *builder) selectOp(cond, a, c mvar, shape []int64) mvar {
	return b.op("select", []arg{{"cond", []mvar{cond}}, {"a", []mvar{a}}, {"b", []mvar{c}}}, a.dt, shape)
}

func (b *builder) softmax(x mvar) mvar {
	return b.op("softmax", []arg{{"x", []mvar{x}}, {"axis", []mvar{b.intScalar(-1)}}}, x.dt, x.shape)
}

func protowireVarint(x uint64) []byte { return binary.AppendUvarint(nil, x) }

// blobWriter lays out weight.bin in Core ML's blob storage v2 layout: a 64-byte file header
// (blob count, version 2), then per blob a 64-byte metadata record (sentinel 0xDEADBEEF, storage
// dtype, size, data offset) followed by the data, every record and data start 64-aligned. A
// BlobFileValue's offset points at the metadata record.
type blobWriter struct {
	buf   []byte
	count uint32
	seen  map[blobKey]uint64
}

type blobKey struct {
	key any
	dt  milType
}

// Blob storage dtypes (MILBlob BlobDataType).
const (
	blobF16 = 1
	blobF32 = 2
)

const blobSentinel = 0xDEADBEEF

func newBlobWriter() *blobWriter {
	return &blobWriter{buf: make([]byte, 64), seen: map[blobKey]uint64{}}
}

func align64(n int) int { return (n + 63) &^ 63 }

func (w *blobWriter) add(dt milType, xs []float32, key any) uint64 {
	if key != nil {
		if off, ok := w.seen[blobKey{key, dt}]; ok {
			return off
		}
	}
	var data []byte
	storage := uint32(blobF32)
	if dt == milF16 {
		storage = blobF16
		for _, x := range xs {
			data = binary.LittleEndian.AppendUint16(data, core.F32ToF16(x))
		}
	} else {
		for _, x := range xs {
			data = binary.LittleEndian.AppendUint32(data, math.Float32bits(x))
		}
	}
	meta := align64(len(w.buf))
	dataOff := meta + 64
	w.buf = append(w.buf, make([]byte, dataOff-len(w.buf))...)
	binary.LittleEndian.PutUint32(w.buf[meta:], blobSentinel)
	binary.LittleEndian.PutUint32(w.buf[meta+4:], storage)
	binary.LittleEndian.PutUint64(w.buf[meta+8:], uint64(len(data)))
	binary.LittleEndian.PutUint64(w.buf[meta+16:], uint64(dataOff))
	w.buf = append(w.buf, data...)
	w.buf = append(w.buf, make([]byte, align64(len(w.buf))-len(w.buf))...)
	w.count++
	if key != nil {
		w.seen[blobKey{key, dt}] = uint64(meta)
	}
	return uint64(meta)
}

func (w *blobWriter) bytes() []byte {
	binary.LittleEndian.PutUint32(w.buf[0:], w.count)
	binary.LittleEndian.PutUint32(w.buf[4:], 2)
	return w.buf
}

// dataKey identifies a graph constant's backing bytes (core.Tensor.Data's contract: graphs
// that share a weight slice share its device copy).
type dataKey struct {
	p unsafe.Pointer
	n int
}

func keyOf(data []byte) any {
	if len(data) == 0 {
		return nil
	}
	return dataKey{unsafe.Pointer(unsafe.SliceData(data)), len(data)}
}
