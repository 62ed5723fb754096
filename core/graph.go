package core

import (
	"errors"
	"fmt"
	"strings"
)

// Shape is a tensor shape, outermost axis first. Rank 0 is a scalar.
type Shape []int64

// MaxDim and MaxElements bound every tensor a Graph accepts (inputs, constants and every
// node's output), as XPU_IR_MAX_DIM and XPU_IR_MAX_NUMEL do in abi/xpu_ir.h: element counts and
// byte sizes of accepted shapes never overflow an int64, here or in a plugin.
const (
	MaxDim      = int64(1) << 40
	MaxElements = int64(1) << 40
)

// NumElements is the product of the dimensions (1 for a scalar). It is exact for every shape
// a Graph accepted (at most MaxElements); on other shapes it may wrap.
func (s Shape) NumElements() int64 {
	n := int64(1)
	for _, d := range s {
		n *= d
	}
	return n
}

// Equal reports whether two shapes are identical.
func (s Shape) Equal(o Shape) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

// String writes the shape as [d0,d1,...].
func (s Shape) String() string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// Clone returns a copy that does not share the backing array.
func (s Shape) Clone() Shape { return append(Shape(nil), s...) }

// TensorKind says where a tensor's bytes come from.
type TensorKind uint32

// Tensor kinds, as XPU_TENSOR_* in xpu_ir.h.
const (
	KindValue TensorKind = 0 // produced by a node
	KindInput TensorKind = 1 // bound at execution
	KindConst TensorKind = 2 // bytes given at build time (weights)
)

// Tensor is a value in a graph. Tensors are created by the Graph's methods, never directly.
type Tensor struct {
	ID    int    // index in Graph.Tensors
	Name  string // unique in the graph
	DType DType
	Shape Shape
	Kind  TensorKind
	// Data holds a constant's bytes (dense, row-major, DType's layout). Backends upload a
	// constant once per context, keyed by this slice's backing array: graphs that share a
	// weight slice share the device copy.
	Data []byte
	// Producer is the index of the node that writes a KindValue tensor, -1 otherwise.
	Producer int
}

// Bytes is the tensor's storage size.
func (t *Tensor) Bytes() int64 { return t.DType.Bytes(t.Shape.NumElements()) }

// String gives the tensor's name, dtype and shape; "<nil>" for a nil tensor.
func (t *Tensor) String() string {
	if t == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%s %s%s", t.Name, t.DType, t.Shape)
}

// Node is one op application. Attribute slots follow abi/OPS.md.
type Node struct {
	ID     int
	Name   string
	Op     Op
	Inputs []*Tensor
	Output *Tensor
	IAttr  [MaxIAttr]int64
	FAttr  [MaxFAttr]float32
}

// String names the node by index, name and op, as error messages do.
func (n *Node) String() string { return fmt.Sprintf("node %d %q (%s)", n.ID, n.Name, n.Op) }

// Graph is a builder and the built graph. Methods that add nodes record the first error and
// return nil afterwards, so a chain of calls needs one check at the end (Err).
type Graph struct {
	Tensors []*Tensor
	Nodes   []*Node
	Inputs  []*Tensor
	Outputs []*Tensor

	names    map[string]int
	err      error
	prefix   string
	nextName string
}

// NewGraph returns an empty graph.
func NewGraph() *Graph { return &Graph{names: map[string]int{}} }

// Err returns the first error recorded while building, or nil.
func (g *Graph) Err() error { return g.err }

// ErrGraph wraps every build-time error, so callers can test with errors.Is.
var ErrGraph = errors.New("invalid graph")

// SetNamePrefix makes the next nodes' names start with p (e.g. "blk.3."): errors then name the
// layer. It returns the previous prefix.
func (g *Graph) SetNamePrefix(p string) string {
	old := g.prefix
	g.prefix = p
	return old
}

func (g *Graph) fail(node string, op Op, format string, args ...any) *Tensor {
	if g.err == nil {
		g.err = fmt.Errorf("%w: node %q (%s): %s", ErrGraph, node, op, fmt.Sprintf(format, args...))
	}
	return nil
}

func (g *Graph) uniqueName(base string) string {
	name := base
	for i := 1; ; i++ {
		if _, ok := g.names[name]; !ok {
			return name
		}
		name = fmt.Sprintf("%s.%d", base, i)
	}
}

func (g *Graph) newTensor(name string, dt DType, shape Shape, kind TensorKind) *Tensor {
	t := &Tensor{ID: len(g.Tensors), Name: g.uniqueName(name), DType: dt, Shape: shape.Clone(),
		Kind: kind, Producer: -1}
	g.names[t.Name] = t.ID
	g.Tensors = append(g.Tensors, t)
	return t
}

func checkShape(dt DType, shape Shape) error {
	if !dt.Valid() {
		return fmt.Errorf("invalid dtype %s", dt)
	}
	if len(shape) > MaxRank {
		return fmt.Errorf("rank %d > %d", len(shape), MaxRank)
	}
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return fmt.Errorf("negative dimension in %s", shape)
		}
		if d > MaxDim {
			return fmt.Errorf("dimension %d in %s is larger than 2^40", d, shape)
		}
		// n <= MaxElements and d <= MaxDim here, so the division guards the product
		if d != 0 && n > MaxElements/d {
			return fmt.Errorf("shape %s has more than 2^40 elements", shape)
		}
		n *= d
	}
	if bl := dt.BlockLen(); bl > 1 && (len(shape) == 0 || shape[len(shape)-1]%bl != 0) {
		return fmt.Errorf("%s needs the last dimension to be a multiple of %d, got %s", dt, bl, shape)
	}
	return nil
}

// Input adds a graph input that is bound at execution.
func (g *Graph) Input(name string, dt DType, shape ...int64) *Tensor {
	if g.err != nil {
		return nil
	}
	if err := checkShape(dt, shape); err != nil {
		return g.fail(name, OpInvalid, "input: %v", err)
	}
	t := g.newTensor(name, dt, shape, KindInput)
	g.Inputs = append(g.Inputs, t)
	return t
}

// Const adds a constant (a weight). data must be exactly the tensor's size; it is not copied.
func (g *Graph) Const(name string, dt DType, shape Shape, data []byte) *Tensor {
	if g.err != nil {
		return nil
	}
	if err := checkShape(dt, shape); err != nil {
		return g.fail(name, OpInvalid, "const: %v", err)
	}
	if want := dt.Bytes(shape.NumElements()); int64(len(data)) != want {
		return g.fail(name, OpInvalid, "const: %d bytes for %s%s, want %d", len(data), dt, shape, want)
	}
	t := g.newTensor(name, dt, shape, KindConst)
	t.Data = data
	return t
}

// Output marks tensors as graph outputs, in order.
func (g *Graph) Output(ts ...*Tensor) {
	if g.err != nil {
		return
	}
	for _, t := range ts {
		if t == nil {
			g.fail("output", OpInvalid, "nil tensor")
			return
		}
		if t.Kind != KindValue {
			g.fail(t.Name, OpInvalid, "output: only node results can be outputs (got %s)", t)
			return
		}
		g.Outputs = append(g.Outputs, t)
	}
}

// Tensor finds a tensor by name.
func (g *Graph) Tensor(name string) (*Tensor, bool) {
	i, ok := g.names[name]
	if !ok {
		return nil, false
	}
	return g.Tensors[i], true
}

// Binding returns the tensor of binding index io in the numbering every Execution.Bind uses:
// the graph's inputs in order, then its outputs.
func (g *Graph) Binding(io int) (*Tensor, error) {
	if io < 0 || io >= len(g.Inputs)+len(g.Outputs) {
		return nil, fmt.Errorf("io %d: the graph has %d inputs and %d outputs: %w", io,
			len(g.Inputs), len(g.Outputs), ErrInvalidArgument)
	}
	if io < len(g.Inputs) {
		return g.Inputs[io], nil
	}
	return g.Outputs[io-len(g.Inputs)], nil
}

// nodeSpec is what an op method hands to add.
type nodeSpec struct {
	op     Op
	name   string
	inputs []*Tensor
	iattr  [MaxIAttr]int64
	fattr  [MaxFAttr]float32
	// out, when set, forces the output dtype/shape (RESHAPE, CAST, QUANTIZE, SLICE).
	outDType DType
	outShape Shape
}

// add validates a node, infers its output and appends it.
func (g *Graph) add(s nodeSpec) *Tensor {
	if g.err != nil {
		return nil
	}
	if s.name == "" {
		s.name = strings.ToLower(s.op.String())
	}
	s.name = g.prefix + s.name
	for i, in := range s.inputs {
		if in == nil {
			return g.fail(s.name, s.op, "input %d is nil", i)
		}
		if in.ID >= len(g.Tensors) || g.Tensors[in.ID] != in {
			return g.fail(s.name, s.op, "input %d (%s) belongs to another graph", i, in.Name)
		}
	}
	n := &Node{ID: len(g.Nodes), Name: g.uniqueName(s.name), Op: s.op, Inputs: s.inputs,
		IAttr: s.iattr, FAttr: s.fattr}
	dt, shape, err := InferOutput(n, s.outDType, s.outShape)
	if err != nil {
		return g.fail(n.Name, s.op, "%v", err)
	}
	out := g.newTensor(n.Name, dt, shape, KindValue)
	out.Producer = n.ID
	n.Output = out
	g.names[n.Name] = out.ID
	g.Nodes = append(g.Nodes, n)
	return out
}

// Validate re-checks a graph that may have been edited by hand (or deserialized): every node's
// output matches what its inputs infer, nodes are in topological order.
func (g *Graph) Validate() error {
	if g.err != nil {
		return g.err
	}
	produced := map[*Tensor]bool{}
	for _, n := range g.Nodes {
		if n == nil || n.Output == nil {
			return fmt.Errorf("%w: a node or its output is nil", ErrGraph)
		}
		for i, in := range n.Inputs {
			if in == nil {
				return fmt.Errorf("%w: %s: input %d is nil", ErrGraph, n, i)
			}
			if in.Kind == KindValue && !produced[in] {
				return fmt.Errorf("%w: %s: input %s is used before it is produced", ErrGraph, n, in.Name)
			}
		}
		dt, shape, err := InferOutput(n, n.Output.DType, n.Output.Shape)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrGraph, n, err)
		}
		if dt != n.Output.DType || !shape.Equal(n.Output.Shape) {
			return fmt.Errorf("%w: %s: output is %s%s, inputs give %s%s", ErrGraph, n,
				n.Output.DType, n.Output.Shape, dt, shape)
		}
		produced[n.Output] = true
	}
	if len(g.Outputs) == 0 {
		return fmt.Errorf("%w: the graph has no outputs", ErrGraph)
	}
	return nil
}
