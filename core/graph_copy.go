package core

// CopyNode adds to g a node like n (its op, name, attributes and output dtype and shape) that
// reads inputs, tensors of g standing for n's inputs. It is how a graph is cut into sub-graphs
// (sched's partitions) with the original node names; like every op method it records an error
// in g (see Err) and returns nil when the inputs do not fit the op.
func (g *Graph) CopyNode(n *Node, inputs ...*Tensor) *Tensor {
	if n == nil || n.Output == nil {
		return g.fail("", OpInvalid, "CopyNode of a nil node or a node without output")
	}
	return g.add(nodeSpec{op: n.Op, name: n.Name, inputs: inputs, iattr: n.IAttr, fattr: n.FAttr,
		outDType: n.Output.DType, outShape: n.Output.Shape})
}
