package coreml

import (
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
)

// Reasons a node is refused. Placement reads them (xpu run --explain), so they say what Core ML
// lacks, not just "no".
const (
	whyZeroSize  = "Core ML multi-arrays cannot be empty (a dimension is 0)"
	whyBF16      = "bfloat16 activations: Core ML ML Programs (iOS 16 target) have no bf16 tensors"
	whyInt8      = "int8 activations need Int8 multi-arrays (specification version 10, iOS 26); this backend targets iOS 16"
	whyQuantAct  = "a block-quantized tensor that is not a constant weight: Core ML dequantizes weights at compile time only"
	whyQuantize  = "QUANTIZE to GGUF blocks: no MIL op writes Q8_0/Q4_0 blocks"
	whyDequant   = "DEQUANTIZE of GGUF blocks at run time: no MIL op reads Q8_0/Q4_0 blocks"
	whyTreeMask  = "ATTENTION with a tree mask: the I8 mask input needs Int8 multi-arrays (specification version 10)"
	whyGatherIDs = "GET_ROWS with computed ids: Core ML's gather does not fail on an id out of range, so ids must be a graph input the backend can check"
	whyKQuant    = "K-quant weights are not lowered yet (they would need constexpr_lut_to_dense / blockwise ops of iOS 18)"
)

func milDType(dt core.DType) (milType, bool) {
	switch dt {
	case core.F32:
		return milF32, true
	case core.F16:
		return milF16, true
	case core.I32:
		return milI32, true
	}
	return 0, false
}

// constWeight reports whether t is a constant that lowering turns into a float const.
func constWeight(t *core.Tensor) bool {
	return t.Kind == core.KindConst && (t.DType == core.Q8_0 || t.DType == core.Q4_0 ||
		t.DType == core.I8 || t.DType == core.BF16 || t.DType.Float())
}

// nodeReason is "" when Core ML can run n, else why not.
func nodeReason(g *core.Graph, n *core.Node) string {
	if n.Op == core.OpShadowMatMul || n.Op == core.OpSparseFFN {
		return n.Op.String() + " (op set 3) is not lowered by this plugin"
	}
	if n.Op == core.OpMatMul && len(n.Inputs) > 2 {
		// op set 3: the lowering reads one weight scale (fattr[0]), so it must not accept these
		return "MATMUL with per-channel I8 weight scales (op set 3) is not lowered by this plugin"
	}
	if n.Op == core.OpAttention && (n.IAttr[2] != 0 || n.IAttr[3] != 0) {
		return "ATTENTION on a KV head range (op set 4) is not lowered by this plugin"
	}
	io := map[*core.Tensor]bool{}
	for _, t := range g.Inputs {
		io[t] = true
	}
	for _, t := range g.Outputs {
		io[t] = true
	}
	all := append(append([]*core.Tensor(nil), n.Inputs...), n.Output)
	for i, t := range all {
		if t.Shape.NumElements() == 0 {
			return whyZeroSize
		}
		if t.DType.KQuant() {
			return whyKQuant
		}
		weightSlot := i == 1 && n.Op == core.OpMatMul || i == 0 && n.Op == core.OpGetRows
		switch {
		case t.DType == core.BF16 && !(weightSlot && t.Kind == core.KindConst):
			return whyBF16
		case t.DType == core.I8 && n.Op == core.OpAttention && i == 4:
			return whyTreeMask
		case t.DType == core.I8 && !(weightSlot && t.Kind == core.KindConst):
			return whyInt8
		case t.DType.Quantized() && n.Op == core.OpQuantize && i == len(all)-1:
			return whyQuantize
		case t.DType.Quantized() && n.Op == core.OpDequantize:
			return whyDequant
		case t.DType.Quantized() && !(weightSlot && t.Kind == core.KindConst):
			return whyQuantAct
		}
	}
	switch n.Op {
	case core.OpQuantize:
		return whyQuantize
	case core.OpDequantize:
		return whyDequant
	case core.OpGetRows:
		if n.Inputs[1].Kind != core.KindInput {
			return whyGatherIDs
		}
	}
	return ""
}

// lowered is a graph as an ML Program plus what the runtime needs to bind it.
type lowered struct {
	model   []byte // the serialized CoreML.Specification.Model
	weights []byte // weights/weight.bin
	inputs  []feature
	outputs []feature
	// idChecks are GET_ROWS ids the backend range-checks before a prediction: input index and
	// the table's row count.
	idChecks []idCheck
}

type feature struct {
	name  string
	dt    core.DType
	shape []int64
}

type idCheck struct {
	input int
	rows  int64
}

// lower turns g into an ML Program. Every node must be supported (nodeReason "").
func lower(g *core.Graph) (*lowered, error) {
	b := newBuilder()
	vals := map[*core.Tensor]mvar{}
	l := &lowered{}
	var fnInputs []mvar
	inputIndex := map[*core.Tensor]int{}
	for i, t := range g.Inputs {
		dt, ok := milDType(t.DType)
		if !ok {
			return nil, fmt.Errorf("coreml: input %q (%s %s): %s: %w", t.Name, t.DType, t.Shape, whyType(t), core.ErrUnsupported)
		}
		// features have rank >= 1: a scalar travels as [1] and is squeezed inside
		v := mvar{name: fmt.Sprintf("in_%d", i), dt: dt, shape: featureShape(t.Shape)}
		fnInputs = append(fnInputs, v)
		inputIndex[t] = i
		l.inputs = append(l.inputs, feature{v.name, t.DType, v.shape})
		if len(t.Shape) == 0 {
			v = b.op("squeeze", []arg{{"x", []mvar{v}}}, dt, nil)
		}
		vals[t] = v
	}
	value := func(t *core.Tensor, want milType) (mvar, error) {
		if v, ok := vals[t]; ok {
			if want == 0 {
				return v, nil
			}
			return b.cast(v, want), nil
		}
		if t.Kind != core.KindConst {
			return mvar{}, fmt.Errorf("coreml: tensor %q has no value", t.Name)
		}
		if want == 0 { // the constant's own precision
			want = milF32
			switch t.DType {
			case core.F16:
				want = milF16
			case core.I32:
				want = milI32
			}
		}
		if t.DType == core.I32 {
			xs := make([]int64, t.Shape.NumElements())
			for i := range xs {
				xs[i] = int64(int32(leU32(t.Data[4*i:])))
			}
			v := b.constInts(t.Shape, xs)
			vals[t] = v
			return b.cast(v, want), nil
		}
		scale := float32(0)
		for _, n := range g.Nodes { // I8 weights carry their scale on the consuming node
			for _, in := range n.Inputs {
				if in == t && t.DType == core.I8 {
					scale = n.FAttr[0]
				}
			}
		}
		xs, err := dequant(t, scale)
		if err != nil {
			return mvar{}, err
		}
		return b.floats(want, t.Shape, xs, keyOf(t.Data)), nil
	}
	for _, n := range g.Nodes {
		if why := nodeReason(g, n); why != "" {
			return nil, fmt.Errorf("coreml: %s: %s: %w", n, why, core.ErrUnsupported)
		}
		out, err := lowerNode(b, n, value, inputIndex, l)
		if err != nil {
			return nil, fmt.Errorf("coreml: %s: %w", n, err)
		}
		vals[n.Output] = out
	}
	var outNames []string
	for _, t := range g.Outputs {
		dt, ok := milDType(t.DType)
		if !ok {
			return nil, fmt.Errorf("coreml: output %q (%s %s): %s: %w", t.Name, t.DType, t.Shape, whyType(t), core.ErrUnsupported)
		}
		v, err := value(t, dt)
		if err != nil {
			return nil, err
		}
		// every output gets its own named op: an input or a value returned twice still has one
		// feature name per output
		var o mvar
		if len(t.Shape) == 0 {
			o = b.op("expand_dims", []arg{{"x", []mvar{v}}, {"axes", []mvar{b.intVec(0)}}}, v.dt, []int64{1})
		} else {
			o = b.op("identity", []arg{{"x", []mvar{v}}}, v.dt, v.shape)
		}
		outNames = append(outNames, o.name)
		l.outputs = append(l.outputs, feature{o.name, t.DType, o.shape})
	}
	l.model = encodeModel(b, fnInputs, l, outNames)
	l.weights = b.blob.bytes()
	return l, nil
}

// featureShape is a model feature's shape: the tensor's, or [1] for a scalar.
func featureShape(s core.Shape) []int64 {
	if len(s) == 0 {
		return []int64{1}
	}
	return s.Clone()
}

func whyType(t *core.Tensor) string {
	return fmt.Sprintf("Core ML model features are Float32, Float16 or Int32 multi-arrays, not %s", t.DType)
}

func leU32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// dequant gives a constant's values as float32 (weights are dequantized when the package is
// written; Core ML then stores them at the activation precision).
func dequant(t *core.Tensor, scale float32) ([]float32, error) {
	switch t.DType {
	case core.F32:
		xs := make([]float32, len(t.Data)/4)
		for i := range xs {
			xs[i] = math.Float32frombits(leU32(t.Data[4*i:]))
		}
		return xs, nil
	case core.BF16:
		xs := make([]float32, len(t.Data)/2)
		for i := range xs {
			xs[i] = core.BF16ToF32(uint16(t.Data[2*i]) | uint16(t.Data[2*i+1])<<8)
		}
		return xs, nil
	}
	return core.Dequantize(t.DType, t.Data, scale)
}

func encodeModel(b *builder, inputs []mvar, l *lowered, outNames []string) []byte {
	feat := func(f feature) msg {
		dt := uint64(arrayFloat32)
		switch f.dt {
		case core.F16:
			dt = arrayFloat16
		case core.I32:
			dt = arrayInt32
		}
		arr := msg(nil).bytes(fArrayShape, packedVarints(f.shape)).varint(fArrayDataType, dt)
		return msg(nil).str(fFeatName, f.name).bytes(fFeatType, msg(nil).bytes(fFeatTypeMultiArray, arr))
	}
	var desc msg
	for _, f := range l.inputs {
		desc = desc.bytes(fDescInput, feat(f))
	}
	for _, f := range l.outputs {
		desc = desc.bytes(fDescOutput, feat(f))
	}
	var block msg
	for _, o := range outNames {
		block = block.str(fBlockOutputs, o)
	}
	for _, op := range b.ops {
		block = block.bytes(fBlockOperations, op)
	}
	var fn msg
	for _, in := range inputs {
		fn = fn.bytes(fFuncInputs, namedType(in))
	}
	fn = fn.str(fFuncOpset, opsetName).mapEntry(fFuncBlocks, opsetName, block)
	prog := msg(nil).varint(fProgVersion, 1).mapEntry(fProgFunctions, funcName, fn)
	return msg(nil).varint(fModelSpecVersion, specVersion).bytes(fModelDescription, desc).bytes(fModelMLProgram, prog)
}
