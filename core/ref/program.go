package ref

import (
	"context"
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// program is a validated graph captured for execution. It does not point back into the Graph,
// so later edits of the Graph cannot change a prepared executable. Constant bytes are shared,
// not copied (the Graph's Data is documented as not copied).
type program struct {
	tensors []tensorInfo
	nodes   []nodeInfo
	inputs  []int
	outputs []int
	// lastUse[t] is the index of the last node reading tensor t, so intermediates can be dropped.
	lastUse []int
}

type tensorInfo struct {
	name  string
	dt    core.DType
	shape core.Shape
	kind  core.TensorKind
	data  []byte
}

func (t tensorInfo) bytes() int64 { return t.dt.Bytes(t.shape.NumElements()) }

type nodeInfo struct {
	name  string
	op    core.Op
	in    []int
	out   int
	iattr [core.MaxIAttr]int64
	fattr [core.MaxFAttr]float32
}

// compile validates g and captures it. The structural checks come before g.Validate because
// shape inference indexes by rank and dereferences tensors: a hand-edited graph must get an
// error, not a panic.
func compile(g *core.Graph) (*program, error) {
	if g == nil {
		return nil, fmt.Errorf("ref: nil graph: %w", core.ErrInvalidArgument)
	}
	p := &program{tensors: make([]tensorInfo, len(g.Tensors)), lastUse: make([]int, len(g.Tensors))}
	for i, t := range g.Tensors {
		if t == nil || t.ID != i {
			return nil, fmt.Errorf("%w: tensor %d is missing or misnumbered", core.ErrGraph, i)
		}
		if err := checkTensor(t); err != nil {
			return nil, err
		}
		p.tensors[i] = tensorInfo{name: t.Name, dt: t.DType, shape: t.Shape.Clone(), kind: t.Kind, data: t.Data}
		p.lastUse[i] = -1
	}
	owns := func(t *core.Tensor) bool {
		return t != nil && t.ID >= 0 && t.ID < len(g.Tensors) && g.Tensors[t.ID] == t
	}
	produced := make([]bool, len(g.Tensors))
	for i, n := range g.Nodes {
		if n == nil || !owns(n.Output) || n.Output.Kind != core.KindValue || produced[n.Output.ID] {
			return nil, fmt.Errorf("%w: node %d: its output is not a fresh value tensor of this graph", core.ErrGraph, i)
		}
		produced[n.Output.ID] = true
		ni := nodeInfo{name: n.Name, op: n.Op, out: n.Output.ID, iattr: n.IAttr, fattr: n.FAttr}
		for j, in := range n.Inputs {
			if !owns(in) {
				return nil, fmt.Errorf("%w: %s: input %d is not a tensor of this graph", core.ErrGraph, n, j)
			}
			ni.in = append(ni.in, in.ID)
			p.lastUse[in.ID] = i
		}
		p.nodes = append(p.nodes, ni)
	}
	if err := g.Validate(); err != nil {
		return nil, err
	}
	bound := make([]bool, len(g.Tensors))
	for i, t := range g.Inputs {
		if !owns(t) || t.Kind != core.KindInput {
			return nil, fmt.Errorf("%w: graph input %d is not an input tensor of this graph", core.ErrGraph, i)
		}
		bound[t.ID] = true
		p.inputs = append(p.inputs, t.ID)
	}
	for _, n := range p.nodes {
		for _, id := range n.in {
			if p.tensors[id].kind == core.KindInput && !bound[id] {
				return nil, fmt.Errorf("%w: node %q reads %s, which is not in the graph's inputs", core.ErrGraph, n.name, p.tensors[id].name)
			}
		}
	}
	for i, t := range g.Outputs {
		if !owns(t) || !produced[t.ID] {
			return nil, fmt.Errorf("%w: graph output %d is not produced by a node of this graph", core.ErrGraph, i)
		}
		p.outputs = append(p.outputs, t.ID)
		p.lastUse[t.ID] = len(g.Nodes) // outputs live to the end
	}
	return p, nil
}

// checkTensor rejects what the builder never makes but a hand-edited graph might: sizes would
// go negative or indexes out of range.
func checkTensor(t *core.Tensor) error {
	bad := !t.DType.Valid() || len(t.Shape) > core.MaxRank || t.Kind > core.KindConst
	for _, d := range t.Shape {
		bad = bad || d < 0
	}
	if bl := t.DType.BlockLen(); bl > 1 && (len(t.Shape) == 0 || t.Shape[len(t.Shape)-1]%bl != 0) {
		bad = true
	}
	if bad {
		return fmt.Errorf("%w: tensor %s: invalid dtype or shape", core.ErrGraph, t)
	}
	if t.Kind == core.KindConst && int64(len(t.Data)) != t.Bytes() {
		return fmt.Errorf("%w: constant %s has %d bytes, want %d", core.ErrGraph, t, len(t.Data), t.Bytes())
	}
	return nil
}

// run evaluates the program. in[i] holds input i's bytes (exactly its size); each out[i] receives
// output i's bytes (exactly its size). A cancelled ctx stops the run between nodes.
func (p *program) run(ctx context.Context, in, out [][]byte) error {
	vals := make([][]byte, len(p.tensors))
	for i, id := range p.inputs {
		vals[id] = in[i]
	}
	for i, t := range p.tensors {
		if t.kind == core.KindConst {
			vals[i] = t.data
		}
	}
	for i := range p.nodes {
		n := &p.nodes[i]
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("ref: run stopped before node %q: %w", n.name, err)
		}
		args := make([]value, len(n.in))
		for j, id := range n.in {
			t := p.tensors[id]
			args[j] = value{dt: t.dt, shape: t.shape, b: vals[id]}
		}
		o := p.tensors[n.out]
		b, err := evalNode(n, args, o)
		if err != nil {
			return fmt.Errorf("ref: node %q (%s): %w", n.name, n.op, err)
		}
		if int64(len(b)) != o.bytes() {
			return fmt.Errorf("ref: node %q (%s) produced %d bytes, want %d: %w", n.name, n.op, len(b), o.bytes(), core.ErrInternal)
		}
		vals[n.out] = b
		for _, id := range n.in {
			if p.lastUse[id] == i && p.tensors[id].kind == core.KindValue {
				vals[id] = nil
			}
		}
	}
	for i, id := range p.outputs {
		copy(out[i], vals[id])
	}
	return nil
}

// evalNode dispatches one node; out describes the output tensor.
func evalNode(n *nodeInfo, in []value, out tensorInfo) ([]byte, error) {
	switch op := n.op; {
	case op.Binary():
		return evalBinary(n, in, out)
	case op.Elementwise():
		return evalUnary(n, in[0])
	case op == core.OpRMSNorm, op == core.OpLayerNorm:
		return evalNorm(n, in[0])
	case op == core.OpSoftmax:
		return evalSoftmax(n, in[0])
	case op == core.OpMatMul && (in[0].dt == core.I8 || len(in) == 3):
		return evalMatMulI8B(n, in, out)
	case op == core.OpMatMul:
		return evalMatMul(n, in, out)
	case op == core.OpShadowMatMul:
		return evalShadowMatMul(n, in, out)
	case op == core.OpSparseFFN:
		return evalSparseFFN(n, in, out)
	case op == core.OpRoPE:
		return evalRoPE(n, in)
	case op == core.OpAttention:
		return evalAttention(n, in, out)
	case op == core.OpGetRows:
		return evalGetRows(n, in, out)
	case op == core.OpCast:
		return evalCast(in[0], out)
	case op == core.OpQuantize:
		return evalQuantize(n, in[0], out)
	case op == core.OpDequantize:
		return evalDequantize(n, in[0])
	case op == core.OpReshape:
		return append([]byte(nil), in[0].b...), nil
	case op == core.OpPermute:
		return evalPermute(n, in[0], out), nil
	case op == core.OpSlice:
		return evalSlice(n, in[0], out), nil
	case op == core.OpConcat:
		return evalConcat(n, in, out), nil
	}
	return nil, fmt.Errorf("op %s: %w", n.op, core.ErrUnsupported)
}

// Run evaluates g on the reference: inputs in Graph.Inputs order, each exactly its tensor's size
// in bytes; it returns the outputs in Graph.Outputs order.
func Run(ctx context.Context, g *core.Graph, inputs [][]byte) ([][]byte, error) {
	p, err := compile(g)
	if err != nil {
		return nil, err
	}
	if len(inputs) != len(p.inputs) {
		return nil, fmt.Errorf("ref: %d inputs given, the graph has %d: %w", len(inputs), len(p.inputs), core.ErrInvalidArgument)
	}
	for i, id := range p.inputs {
		t := p.tensors[id]
		if int64(len(inputs[i])) != t.bytes() {
			return nil, fmt.Errorf("ref: input %d (%s %s%s) has %d bytes, want %d: %w",
				i, t.name, t.dt, t.shape, len(inputs[i]), t.bytes(), core.ErrInvalidArgument)
		}
	}
	outs := make([][]byte, len(p.outputs))
	for i, id := range p.outputs {
		outs[i] = make([]byte, p.tensors[id].bytes())
	}
	if err := p.run(ctx, inputs, outs); err != nil {
		return nil, err
	}
	return outs, nil
}
