package emu

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/xpuhub/xpu/internal/safefile"
)

// Specification field numbers, as Apple publishes them (Model.proto, FeatureTypes.proto,
// MIL.proto), kept apart from the writer's copy so that a wrong number on one side shows up.
const (
	modelSpecVersion = 1
	modelDescription = 2
	modelMLProgram   = 502
	descInput        = 1
	descOutput       = 10
	featName         = 1
	featType         = 3
	typeMultiArray   = 5
	arrShape         = 1
	arrDataType      = 2

	progFunctions = 2
	funcInputs    = 1
	funcOpset     = 2
	funcBlocks    = 3
	blockOutputs  = 2
	blockOps      = 3
	opType        = 1
	opInputs      = 2
	opOutputs     = 3
	opBlocks      = 4
	opAttrs       = 5
	nvtName       = 1
	nvtType       = 2
	vtTensor      = 1
	ttDataType    = 1
	ttRank        = 2
	ttDims        = 3
	dimConstant   = 1
	valType       = 2
	valImmediate  = 3
	valBlob       = 5
)

// DType is a MIL data type.
type DType int

// MIL data types this emulator knows.
const (
	Bool DType = 1
	Str  DType = 2
	F16  DType = 10
	F32  DType = 11
	I32  DType = 23
)

func (d DType) String() string {
	switch d {
	case Bool:
		return "bool"
	case Str:
		return "string"
	case F16:
		return "fp16"
	case F32:
		return "fp32"
	case I32:
		return "int32"
	}
	return fmt.Sprintf("dtype(%d)", int(d))
}

// Multi-array feature data types.
const (
	ArrayFloat32 = 0x10020
	ArrayFloat16 = 0x10010
	ArrayInt32   = 0x20020
)

// Feature is one model input or output.
type Feature struct {
	Name  string
	DType DType // F32, F16 or I32
	Shape []int64
}

// Type is a tensor type.
type Type struct {
	DType DType
	Shape []int64
}

func (t Type) String() string { return fmt.Sprintf("%s%v", t.DType, t.Shape) }

func (t Type) numel() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

func (t Type) equal(o Type) bool {
	if t.DType != o.DType || len(t.Shape) != len(o.Shape) {
		return false
	}
	for i := range t.Shape {
		if t.Shape[i] != o.Shape[i] {
			return false
		}
	}
	return true
}

// operation is one parsed MIL operation.
type operation struct {
	typ    string
	inputs map[string][]string // parameter -> bound value names
	out    string
	outT   Type
	val    *tensor // const's value
}

// Model is a parsed and checked ML Program, ready to execute.
type Model struct {
	SpecVersion int
	Opset       string
	Inputs      []Feature
	Outputs     []Feature
	// Ops counts operations by type (what a report or a test can look at).
	Ops map[string]int

	ops     []operation
	results []string
	types   map[string]Type
	consts  map[string]*tensor
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_@]*$`)

// opsetSpec is the least specification version of each opset name.
var opsetSpec = map[string]int{"CoreML5": 6, "CoreML6": 7, "CoreML7": 8, "CoreML8": 9}

// Load reads, parses and checks the .mlpackage directory dir.
func Load(dir string) (*Model, error) {
	mb, err := safefile.ReadFile(filepath.Join(dir, "Manifest.json"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidModel, err)
	}
	var man struct {
		Entries map[string]struct {
			Path string `json:"path"`
		} `json:"itemInfoEntries"`
		Root string `json:"rootModelIdentifier"`
	}
	if err := json.Unmarshal(mb, &man); err != nil {
		return nil, fmt.Errorf("%w: Manifest.json: %v", ErrInvalidModel, err)
	}
	root, ok := man.Entries[man.Root]
	if !ok {
		return nil, fmt.Errorf("%w: Manifest.json: root %q is not an item", ErrInvalidModel, man.Root)
	}
	data := filepath.Join(dir, "Data")
	spec, err := safefile.ReadFile(filepath.Join(data, filepath.FromSlash(root.Path)))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidModel, err)
	}
	// @model_path resolves to the directory holding the specification
	modelDir := filepath.Dir(filepath.Join(data, filepath.FromSlash(root.Path)))
	return parseModel(spec, func(name string) ([]byte, error) {
		rel, ok := strings.CutPrefix(name, "@model_path/")
		if !ok || strings.Contains(rel, "..") {
			return nil, fmt.Errorf("%w: blob file %q is not under @model_path", ErrInvalidModel, name)
		}
		return safefile.ReadFile(filepath.Join(modelDir, filepath.FromSlash(rel)))
	})
}

// Parse checks a specification whose weight files readBlob returns by name (as in
// BlobFileValue.fileName). Fuzzing enters here.
func Parse(spec []byte, readBlob func(name string) ([]byte, error)) (*Model, error) {
	return parseModel(spec, readBlob)
}

func parseModel(spec []byte, readBlob func(string) ([]byte, error)) (*Model, error) {
	top, err := parseFields(spec)
	if err != nil {
		return nil, err
	}
	m := &Model{SpecVersion: int(int32(top.uint(modelSpecVersion))), types: map[string]Type{},
		consts: map[string]*tensor{}, Ops: map[string]int{}}
	desc, ok, err := top.msg(modelDescription)
	if err != nil || !ok {
		return nil, fmt.Errorf("%w: no model description", ErrInvalidModel)
	}
	if m.Inputs, err = features(desc.all(descInput)); err != nil {
		return nil, err
	}
	if m.Outputs, err = features(desc.all(descOutput)); err != nil {
		return nil, err
	}
	if len(m.Outputs) == 0 {
		return nil, fmt.Errorf("%w: the model has no output", ErrInvalidModel)
	}
	prog, ok, err := top.msg(modelMLProgram)
	if err != nil || !ok {
		return nil, fmt.Errorf("%w: not an ML Program (field mlProgram absent)", ErrInvalidModel)
	}
	if m.SpecVersion < 6 {
		return nil, fmt.Errorf("%w: ML Programs need specification version >= 6, have %d", ErrInvalidModel, m.SpecVersion)
	}
	for _, f := range append(append([]Feature(nil), m.Inputs...), m.Outputs...) {
		if f.DType == F16 && m.SpecVersion < 7 {
			return nil, fmt.Errorf("%w: Float16 feature %q needs specification version >= 7", ErrInvalidModel, f.Name)
		}
	}
	fns, _, err := prog.mapEntries(progFunctions)
	if err != nil {
		return nil, err
	}
	fn, ok := fns["main"]
	if !ok || len(fns) != 1 {
		return nil, fmt.Errorf("%w: want exactly one function, \"main\" (have %d)", ErrInvalidModel, len(fns))
	}
	m.Opset = fn.str(funcOpset)
	need, ok := opsetSpec[m.Opset]
	if !ok {
		return nil, fmt.Errorf("%w: unknown opset %q", ErrInvalidModel, m.Opset)
	}
	if m.SpecVersion < need {
		return nil, fmt.Errorf("%w: opset %s needs specification version >= %d, have %d", ErrInvalidModel, m.Opset, need, m.SpecVersion)
	}
	// function inputs must be exactly the description's inputs
	fin := fn.all(funcInputs)
	if len(fin) != len(m.Inputs) {
		return nil, fmt.Errorf("%w: function has %d inputs, description %d", ErrInvalidModel, len(fin), len(m.Inputs))
	}
	for i, f := range fin {
		name, t, err := namedType(f.b)
		if err != nil {
			return nil, err
		}
		d := m.Inputs[i]
		if name != d.Name || !t.equal(Type{d.DType, d.Shape}) {
			return nil, fmt.Errorf("%w: function input %d %s %v does not match description %s %v", ErrInvalidModel, i, name, t, d.Name, Type{d.DType, d.Shape})
		}
		if err := m.define(name, t); err != nil {
			return nil, err
		}
	}
	blocks, _, err := fn.mapEntries(funcBlocks)
	if err != nil {
		return nil, err
	}
	block, ok := blocks[m.Opset]
	if !ok {
		return nil, fmt.Errorf("%w: no block specialization for opset %s", ErrInvalidModel, m.Opset)
	}
	blobs := map[string][]byte{}
	for _, f := range block.all(blockOps) {
		op, err := m.parseOp(f.b, blobs, readBlob)
		if err != nil {
			return nil, err
		}
		m.ops = append(m.ops, op)
		m.Ops[op.typ]++
	}
	outs := block.all(blockOutputs)
	if len(outs) != len(m.Outputs) {
		return nil, fmt.Errorf("%w: block returns %d values, description has %d outputs", ErrInvalidModel, len(outs), len(m.Outputs))
	}
	for i, o := range outs {
		name := string(o.b)
		t, ok := m.types[name]
		d := m.Outputs[i]
		if !ok {
			return nil, fmt.Errorf("%w: block output %q is not defined", ErrInvalidModel, name)
		}
		if name != d.Name || !t.equal(Type{d.DType, d.Shape}) {
			return nil, fmt.Errorf("%w: block output %s %v does not match description %s %v", ErrInvalidModel, name, t, d.Name, Type{d.DType, d.Shape})
		}
		m.results = append(m.results, name)
	}
	return m, nil
}

func (m *Model) define(name string, t Type) error {
	if !identRE.MatchString(name) {
		return fmt.Errorf("%w: %q is not a MIL identifier", ErrInvalidModel, name)
	}
	if _, dup := m.types[name]; dup {
		return fmt.Errorf("%w: %q defined twice (SSA)", ErrInvalidModel, name)
	}
	m.types[name] = t
	return nil
}

func features(fs []field) ([]Feature, error) {
	var out []Feature
	for _, f := range fs {
		ff, err := parseFields(f.b)
		if err != nil {
			return nil, err
		}
		ft, ok, err := ff.msg(featType)
		if err != nil {
			return nil, err
		}
		arr, ok2, err := ft.msg(typeMultiArray)
		if err != nil || !ok || !ok2 {
			return nil, fmt.Errorf("%w: feature %q is not a multi-array", ErrInvalidModel, ff.str(featName))
		}
		shape, err := arr.packed(arrShape, false)
		if err != nil {
			return nil, err
		}
		fe := Feature{Name: ff.str(featName)}
		if len(shape) == 0 {
			return nil, fmt.Errorf("%w: feature %q has no shape", ErrInvalidModel, fe.Name)
		}
		for _, d := range shape {
			if int64(d) <= 0 || int64(d) > 1<<40 {
				return nil, fmt.Errorf("%w: feature %q: dimension %d", ErrInvalidModel, fe.Name, int64(d))
			}
			fe.Shape = append(fe.Shape, int64(d))
		}
		switch arr.uint(arrDataType) {
		case ArrayFloat32:
			fe.DType = F32
		case ArrayFloat16:
			fe.DType = F16
		case ArrayInt32:
			fe.DType = I32
		default:
			return nil, fmt.Errorf("%w: feature %q: multi-array data type %#x", ErrInvalidModel, fe.Name, arr.uint(arrDataType))
		}
		out = append(out, fe)
	}
	return out, nil
}

func valueType(b []byte) (Type, error) {
	vt, err := parseFields(b)
	if err != nil {
		return Type{}, err
	}
	tt, ok, err := vt.msg(vtTensor)
	if err != nil || !ok {
		return Type{}, fmt.Errorf("%w: only tensor types are supported", ErrInvalidModel)
	}
	t := Type{DType: DType(tt.uint(ttDataType))}
	switch t.DType {
	case Bool, Str, F16, F32, I32:
	default:
		return Type{}, fmt.Errorf("%w: data type %d", ErrInvalidModel, int(t.DType))
	}
	dims := tt.all(ttDims)
	if int(int64(tt.uint(ttRank))) != len(dims) {
		return Type{}, fmt.Errorf("%w: rank %d with %d dimensions", ErrInvalidModel, int64(tt.uint(ttRank)), len(dims))
	}
	t.Shape = []int64{}
	for _, d := range dims {
		df, err := parseFields(d.b)
		if err != nil {
			return Type{}, err
		}
		c, ok, err := df.msg(dimConstant)
		if err != nil || !ok {
			return Type{}, fmt.Errorf("%w: only constant dimensions are supported (static shapes)", ErrInvalidModel)
		}
		v := int64(c.uint(1))
		if v <= 0 || v > 1<<40 {
			return Type{}, fmt.Errorf("%w: dimension %d", ErrInvalidModel, v)
		}
		t.Shape = append(t.Shape, v)
		if t.numel() > 1<<40 { // checked per dimension: the product never overflows
			return Type{}, fmt.Errorf("%w: %v is too large", ErrInvalidModel, t)
		}
	}
	if t.numel() > 1<<40 {
		return Type{}, fmt.Errorf("%w: %v is too large", ErrInvalidModel, t)
	}
	return t, nil
}

func namedType(b []byte) (string, Type, error) {
	f, err := parseFields(b)
	if err != nil {
		return "", Type{}, err
	}
	tf, ok := f.last(nvtType)
	if !ok {
		return "", Type{}, fmt.Errorf("%w: %q has no type", ErrInvalidModel, f.str(nvtName))
	}
	t, err := valueType(tf.b)
	return f.str(nvtName), t, err
}

// constValue decodes a const op's "val" Value against its declared type.
func constValue(b []byte, t Type, blobs map[string][]byte, readBlob func(string) ([]byte, error)) (*tensor, error) {
	v, err := parseFields(b)
	if err != nil {
		return nil, err
	}
	tf, ok := v.last(valType)
	if !ok {
		return nil, fmt.Errorf("%w: const value without a type", ErrInvalidModel)
	}
	vt, err := valueType(tf.b)
	if err != nil {
		return nil, err
	}
	if !vt.equal(t) {
		return nil, fmt.Errorf("%w: const value type %v differs from the output type %v", ErrInvalidModel, vt, t)
	}
	n := t.numel()
	out := &tensor{Type: t}
	if bl, ok, err := v.msg(valBlob); err != nil {
		return nil, err
	} else if ok {
		return blobValue(bl, out, blobs, readBlob)
	}
	imm, ok, err := v.msg(valImmediate)
	if err != nil || !ok {
		return nil, fmt.Errorf("%w: const value is neither immediate nor a blob", ErrInvalidModel)
	}
	tv, ok, err := imm.msg(1)
	if err != nil || !ok {
		return nil, fmt.Errorf("%w: const immediate is not a tensor", ErrInvalidModel)
	}
	want := map[DType]int{F32: 1, I32: 2, Bool: 3, Str: 4}[t.DType]
	if want == 0 {
		return nil, fmt.Errorf("%w: immediate %s values are not supported by this emulator", ErrInvalidModel, t.DType)
	}
	rep, ok, err := tv.msg(protowireNum(want))
	if err != nil || !ok {
		return nil, fmt.Errorf("%w: immediate %v holds no %s values", ErrInvalidModel, t, t.DType)
	}
	switch t.DType {
	case Str:
		ss := rep.all(1)
		if len(ss) != 1 || n != 1 {
			return nil, fmt.Errorf("%w: string consts must be scalars", ErrInvalidModel)
		}
		out.s = string(ss[0].b)
		return out, nil
	case F32:
		xs, err := rep.packed(1, true)
		if err != nil {
			return nil, err
		}
		if int64(len(xs)) != n {
			return nil, fmt.Errorf("%w: %v immediate has %d values", ErrInvalidModel, t, len(xs))
		}
		for _, x := range xs {
			out.f = append(out.f, math.Float32frombits(uint32(x)))
		}
	default:
		xs, err := rep.packed(1, false)
		if err != nil {
			return nil, err
		}
		if int64(len(xs)) != n {
			return nil, fmt.Errorf("%w: %v immediate has %d values", ErrInvalidModel, t, len(xs))
		}
		for _, x := range xs {
			if t.DType == Bool {
				out.b = append(out.b, x != 0)
			} else {
				out.i = append(out.i, int32(x))
			}
		}
	}
	return out, nil
}

// blobValue reads a tensor from weight storage v2: a 64-byte header (count, version 2) and, at
// the value's offset, a 64-byte record (0xDEADBEEF, storage type, size, data offset).
func blobValue(bl fields, out *tensor, blobs map[string][]byte, readBlob func(string) ([]byte, error)) (*tensor, error) {
	name := bl.str(1)
	data, ok := blobs[name]
	if !ok {
		var err error
		if data, err = readBlob(name); err != nil {
			return nil, fmt.Errorf("%w: blob file %q: %v", ErrInvalidModel, name, err)
		}
		if len(data) < 64 || binary.LittleEndian.Uint32(data[4:]) != 2 {
			return nil, fmt.Errorf("%w: %q is not a version 2 weight file", ErrInvalidModel, name)
		}
		blobs[name] = data
	}
	off := bl.uint(2)
	if off < 64 || off%64 != 0 || off > uint64(len(data)) || uint64(len(data))-off < 64 {
		return nil, fmt.Errorf("%w: blob offset %d outside %q (%d bytes) or misaligned", ErrInvalidModel, off, name, len(data))
	}
	rec := data[off:]
	if binary.LittleEndian.Uint32(rec) != 0xDEADBEEF {
		return nil, fmt.Errorf("%w: no blob record at offset %d", ErrInvalidModel, off)
	}
	storage := binary.LittleEndian.Uint32(rec[4:])
	size := binary.LittleEndian.Uint64(rec[8:])
	doff := binary.LittleEndian.Uint64(rec[16:])
	elem := map[DType]uint64{F16: 2, F32: 4}[out.DType]
	wantStorage := map[DType]uint32{F16: 1, F32: 2}[out.DType]
	if elem == 0 || storage != wantStorage {
		return nil, fmt.Errorf("%w: blob at %d: storage type %d for a %s tensor", ErrInvalidModel, off, storage, out.DType)
	}
	if size != uint64(out.numel())*elem {
		return nil, fmt.Errorf("%w: blob at %d holds %d bytes, %v needs %d", ErrInvalidModel, off, size, out.Type, uint64(out.numel())*elem)
	}
	if doff%64 != 0 || doff < off+64 || doff > uint64(len(data)) || uint64(len(data))-doff < size {
		return nil, fmt.Errorf("%w: blob data [%d, +%d) outside %q", ErrInvalidModel, doff, size, name)
	}
	raw := data[doff : doff+size]
	out.f = make([]float32, out.numel())
	for i := range out.f {
		if out.DType == F16 {
			out.f[i] = halfToF32(binary.LittleEndian.Uint16(raw[2*i:]))
		} else {
			out.f[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	}
	return out, nil
}
