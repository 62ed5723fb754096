package core

import "math"

// RejectedNode is a one-node graph that breaks an op's rules (abi/OPS.md): a wrong number of
// inputs, shapes or dtypes the op does not take, a bad attribute, or an output that is not what
// the inputs give. Graph.Validate refuses every one; the builder could not have made them, so
// they are assembled by hand. Conformance sends them to each backend, which must refuse them
// too: that is how InferOutput and the plugins' C rules (abi/xpu_validate.h) are kept agreeing.
type RejectedNode struct {
	Name  string // what is wrong, for a failure message
	Graph *Graph // graph inputs are KindInput tensors; no constants
}

// rts is a tensor of a hand-built graph: a dtype and a shape.
type rts struct {
	dt    DType
	shape Shape
}

func rt(dt DType, shape ...int64) rts { return rts{dt, Shape(shape)} }

// handNode builds a graph of one node without the builder's checks.
func handNode(name string, op Op, out rts, ins []rts, iattr []int64, fattr []float32) RejectedNode {
	g := NewGraph()
	n := &Node{ID: 0, Name: "bad", Op: op}
	copy(n.IAttr[:], iattr)
	copy(n.FAttr[:], fattr)
	for i, in := range ins {
		x := &Tensor{ID: i, Name: "in" + string(rune('0'+i)), DType: in.dt, Shape: in.shape, Kind: KindInput, Producer: -1}
		g.Tensors = append(g.Tensors, x)
		g.Inputs = append(g.Inputs, x)
		n.Inputs = append(n.Inputs, x)
	}
	o := &Tensor{ID: len(ins), Name: "out", DType: out.dt, Shape: out.shape, Kind: KindValue, Producer: 0}
	g.Tensors = append(g.Tensors, o)
	n.Output = o
	g.Nodes = append(g.Nodes, n)
	g.Outputs = append(g.Outputs, o)
	return RejectedNode{Name: name, Graph: g}
}

// RejectedNodes returns fresh copies of the rejected-node table (callers may encode or edit
// them).
func RejectedNodes() []RejectedNode {
	f2x3 := rt(F32, 2, 3)
	return []RejectedNode{
		// arity: every op, too few and too many inputs
		handNode("MATMUL without inputs", OpMatMul, f2x3, nil, nil, nil),
		handNode("MATMUL with 1 input", OpMatMul, f2x3, []rts{rt(F32, 2, 4)}, nil, nil),
		handNode("MATMUL with 4 inputs", OpMatMul, f2x3, []rts{rt(F32, 2, 4), rt(F32, 3, 4), rt(F32, 3), rt(F32, 3)}, nil, nil),
		handNode("ADD with 1 input", OpAdd, f2x3, []rts{f2x3}, nil, nil),
		handNode("SUB with 3 inputs", OpSub, f2x3, []rts{f2x3, f2x3, f2x3}, nil, nil),
		handNode("SILU without inputs", OpSiLU, f2x3, nil, nil, nil),
		handNode("RMS_NORM with 2 inputs", OpRMSNorm, f2x3, []rts{f2x3, f2x3}, nil, []float32{1e-5}),
		handNode("SOFTMAX without inputs", OpSoftmax, f2x3, nil, nil, nil),
		handNode("ROPE with 1 input", OpRoPE, rt(F32, 4, 2, 8), []rts{rt(F32, 4, 2, 8)}, nil, nil),
		handNode("ATTENTION with 2 inputs", OpAttention, rt(F32, 1, 4, 4), []rts{rt(F32, 1, 4, 4), rt(F32, 3, 4, 4)}, nil, nil),
		handNode("ATTENTION with 6 inputs", OpAttention, rt(F32, 1, 4, 4), []rts{rt(F32, 1, 4, 4), rt(F32, 3, 4, 4),
			rt(F32, 3, 4, 4), rt(I32, 1), rt(I8, 1, 1), rt(I8, 1, 1)}, []int64{1}, nil),
		handNode("GET_ROWS with 1 input", OpGetRows, rt(F32, 2, 8), []rts{rt(F32, 4, 8)}, nil, nil),
		handNode("CAST without inputs", OpCast, rt(F16, 2), nil, nil, nil),
		handNode("QUANTIZE without inputs", OpQuantize, rt(I8, 4), nil, nil, []float32{0.5}),
		handNode("DEQUANTIZE without inputs", OpDequantize, rt(F32, 32), nil, nil, []float32{0.5}),
		handNode("RESHAPE without inputs", OpReshape, rt(F32, 6), nil, nil, nil),
		handNode("PERMUTE without inputs", OpPermute, rt(F32, 3, 2), nil, []int64{1, 0}, nil),
		handNode("SLICE without inputs", OpSlice, rt(F32, 2), nil, nil, nil),
		handNode("CONCAT without inputs", OpConcat, rt(F32, 4), nil, nil, nil),
		handNode("SHADOW_MATMUL with 1 input", OpShadowMatMul, rt(F32, 2, 3), []rts{rt(F32, 2, 4)}, nil, []float32{1}),
		handNode("SPARSE_FFN with 2 inputs", OpSparseFFN, rt(F32, 2, 4), []rts{rt(F32, 2, 4), rt(F32, 8, 12)}, nil, nil),
		// shapes, dtypes and attributes (the builder's own error cases, core/graph_test.go)
		handNode("MATMUL inner dims differ", OpMatMul, rt(F32, 2, 8), []rts{rt(F32, 2, 64), rt(F32, 8, 32)}, nil, nil),
		handNode("MATMUL quantized b of rank 3", OpMatMul, rt(F32, 2, 2, 4), []rts{rt(F32, 2, 32), rt(Q8_0, 2, 4, 32)}, nil, nil),
		handNode("MATMUL rank-1 a with a batched b", OpMatMul, rt(F32, 3), []rts{rt(F32, 4), rt(F32, 2, 3, 4)}, nil, nil),
		handNode("MATMUL i8 a without its scale", OpMatMul, rt(F32, 2, 3), []rts{rt(I8, 2, 4), rt(I8, 3, 4)}, nil, []float32{0.5}),
		handNode("MATMUL i8 b without its scale", OpMatMul, rt(F32, 2, 3), []rts{rt(F32, 2, 4), rt(I8, 3, 4)}, nil, nil),
		handNode("MATMUL per-channel scales of the wrong length", OpMatMul, rt(F32, 2, 3),
			[]rts{rt(I8, 2, 4), rt(I8, 3, 4), rt(F32, 2)}, nil, []float32{0, 0.5}),
		handNode("MATMUL output of another dtype", OpMatMul, rt(F16, 2, 3), []rts{rt(F32, 2, 4), rt(F32, 3, 4)}, nil, nil),
		handNode("MATMUL output not [M,N]", OpMatMul, rt(F32, 2, 4), []rts{rt(F32, 2, 4), rt(F32, 3, 4)}, nil, nil),
		handNode("ADD shapes do not broadcast", OpAdd, f2x3, []rts{f2x3, rt(F32, 4)}, nil, nil),
		handNode("ADD output not the broadcast", OpAdd, rt(F32, 2, 4), []rts{f2x3, rt(F32, 3)}, nil, nil),
		handNode("MUL dtypes differ", OpMul, rt(F32, 2), []rts{rt(F32, 2), rt(F16, 2)}, nil, nil),
		handNode("DIV of i32", OpDiv, rt(I32, 2), []rts{rt(I32, 2), rt(I32, 2)}, nil, nil),
		handNode("SILU output shape differs", OpSiLU, rt(F32, 4), []rts{rt(F32, 3)}, nil, nil),
		handNode("RMS_NORM of a scalar", OpRMSNorm, rt(F32), []rts{rt(F32)}, nil, []float32{1e-5}),
		handNode("causal SOFTMAX of rank 1", OpSoftmax, rt(F32, 8), []rts{rt(F32, 8)}, []int64{1}, nil),
		handNode("ATTENTION query heads not a multiple of kv heads", OpAttention, rt(F32, 1, 6, 4),
			[]rts{rt(F32, 1, 6, 4), rt(F32, 3, 4, 4), rt(F32, 3, 4, 4)}, nil, nil),
		handNode("ATTENTION kv head range past k", OpAttention, rt(F32, 1, 4, 4),
			[]rts{rt(F32, 1, 4, 4), rt(F32, 3, 4, 4), rt(F32, 3, 4, 4)}, []int64{0, 0, 3, 2}, nil),
		handNode("ATTENTION k and v of different lengths", OpAttention, rt(F32, 1, 4, 4),
			[]rts{rt(F32, 1, 4, 4), rt(F32, 3, 4, 4), rt(F32, 5, 4, 4)}, nil, nil),
		handNode("ATTENTION q_offset not i32 [1]", OpAttention, rt(F32, 2, 4, 4),
			[]rts{rt(F32, 2, 4, 4), rt(F32, 3, 4, 4), rt(F32, 3, 4, 4), rt(F32, 1), rt(I8, 2, 2)}, []int64{1}, nil),
		handNode("ATTENTION mask without the causal flag", OpAttention, rt(F32, 2, 4, 4),
			[]rts{rt(F32, 2, 4, 4), rt(F32, 3, 4, 4), rt(F32, 3, 4, 4), rt(I32, 1), rt(I8, 2, 2)}, nil, nil),
		// op set v5: the sliding window needs causal attention and no mask, the soft-cap is a
		// finite c >= 0, and a quantized k or v has whole blocks per head
		handNode("ATTENTION window without the causal flag", OpAttention, rt(F32, 1, 4, 4),
			[]rts{rt(F32, 1, 4, 4), rt(F32, 3, 4, 4), rt(F32, 3, 4, 4)}, []int64{0, 0, 0, 0, 2}, nil),
		handNode("ATTENTION window with a mask", OpAttention, rt(F32, 2, 4, 4),
			[]rts{rt(F32, 2, 4, 4), rt(F32, 3, 4, 4), rt(F32, 3, 4, 4), rt(I32, 1), rt(I8, 2, 2)}, []int64{1, 0, 0, 0, 2}, nil),
		handNode("ATTENTION negative window", OpAttention, rt(F32, 1, 4, 4),
			[]rts{rt(F32, 1, 4, 4), rt(F32, 3, 4, 4), rt(F32, 3, 4, 4)}, []int64{1, 0, 0, 0, -1}, nil),
		handNode("ATTENTION negative soft-cap", OpAttention, rt(F32, 1, 4, 4),
			[]rts{rt(F32, 1, 4, 4), rt(F32, 3, 4, 4), rt(F32, 3, 4, 4)}, nil, []float32{0, -1}),
		handNode("ATTENTION NaN soft-cap", OpAttention, rt(F32, 1, 4, 4),
			[]rts{rt(F32, 1, 4, 4), rt(F32, 3, 4, 4), rt(F32, 3, 4, 4)}, nil, []float32{0, float32(math.NaN())}),
		handNode("ATTENTION infinite soft-cap", OpAttention, rt(F32, 1, 4, 4),
			[]rts{rt(F32, 1, 4, 4), rt(F32, 3, 4, 4), rt(F32, 3, 4, 4)}, nil, []float32{0, float32(math.Inf(1))}),
		handNode("ATTENTION q8_0 k with a head dim not a multiple of 32", OpAttention, rt(F32, 1, 4, 16),
			[]rts{rt(F32, 1, 4, 16), rt(Q8_0, 3, 4, 16), rt(F32, 3, 4, 16)}, nil, nil),
		handNode("ATTENTION q4_0 v with a head dim not a multiple of 32", OpAttention, rt(F32, 1, 4, 32),
			[]rts{rt(F32, 1, 4, 32), rt(F32, 3, 4, 32), rt(Q4_0, 3, 4, 48)}, nil, nil),
		handNode("ATTENTION k of a k-quant", OpAttention, rt(F32, 1, 1, 256),
			[]rts{rt(F32, 1, 1, 256), rt(Q4_K, 3, 1, 256), rt(F32, 3, 1, 256)}, nil, nil),
		handNode("TANH of i32", OpTanh, rt(I32, 4), []rts{rt(I32, 4)}, nil, nil),
		handNode("TANH with 2 inputs", OpTanh, rt(F32, 4), []rts{rt(F32, 4), rt(F32, 4)}, nil, nil),
		handNode("ROPE positions of the wrong length", OpRoPE, rt(F32, 4, 2, 8), []rts{rt(F32, 4, 2, 8), rt(I32, 3)}, nil, nil),
		handNode("ROPE odd rotary dims", OpRoPE, rt(F32, 4, 2, 8), []rts{rt(F32, 4, 2, 8), rt(I32, 4)}, []int64{0, 3}, nil),
		handNode("ROPE unknown mode", OpRoPE, rt(F32, 4, 2, 8), []rts{rt(F32, 4, 2, 8), rt(I32, 4)}, []int64{1}, nil),
		handNode("GET_ROWS f32 ids", OpGetRows, rt(F32, 2, 8), []rts{rt(F32, 4, 8), rt(F32, 2)}, nil, nil),
		handNode("GET_ROWS output not [ids..., K]", OpGetRows, rt(F32, 3, 8), []rts{rt(F32, 4, 8), rt(I32, 2)}, nil, nil),
		handNode("CAST from q8_0", OpCast, rt(F32, 32), []rts{rt(Q8_0, 32)}, nil, nil),
		handNode("QUANTIZE to i8 without a scale", OpQuantize, rt(I8, 4), []rts{rt(F32, 4)}, nil, nil),
		handNode("DEQUANTIZE of f32", OpDequantize, rt(F32, 4), []rts{rt(F32, 4)}, nil, nil),
		handNode("RESHAPE changes the element count", OpReshape, rt(F32, 5), []rts{rt(F32, 2, 6)}, nil, nil),
		handNode("PERMUTE not a permutation", OpPermute, rt(F32, 2, 2), []rts{rt(F32, 2, 3)}, []int64{0, 0}, nil),
		handNode("SLICE out of range", OpSlice, rt(F32, 3), []rts{rt(F32, 5)}, []int64{0, 3}, nil),
		handNode("CONCAT inputs differ off the axis", OpConcat, rt(F32, 2, 6), []rts{f2x3, rt(F32, 3, 3)}, []int64{1}, nil),
		handNode("CONCAT output not the sum", OpConcat, rt(F32, 2, 7), []rts{f2x3, f2x3}, []int64{1}, nil),
		handNode("SHADOW_MATMUL without a threshold", OpShadowMatMul, rt(F32, 2, 3), []rts{rt(F32, 2, 4), rt(F32, 4, 3)}, nil, nil),
		handNode("SPARSE_FFN bundles too short", OpSparseFFN, rt(F32, 2, 4), []rts{rt(F32, 2, 4), rt(F32, 8, 11), rt(I32, 3)}, nil, nil),
	}
}
