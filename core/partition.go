package core

import (
	"fmt"
	"slices"
)

// Partition is a run of consecutive nodes placed on one device, as a graph of its own: tensors
// that cross into it are its inputs, tensors that leave it (to another partition or as graph
// outputs) are its outputs. Its constants share their bytes with the original graph.
type Partition struct {
	Index  int
	Device int   // index into the devices the assignment refers to
	Nodes  []int // node IDs in the original graph, in order
	// Graph is the sub-graph; its Inputs and Outputs correspond one to one to Inputs and
	// Outputs below.
	Graph *Graph
	// Inputs and Outputs are the original graph's tensors.
	Inputs  []*Tensor
	Outputs []*Tensor
	// Deps are the indices of the partitions that produce this one's inputs.
	Deps []int
}

// SplitGraph cuts g into partitions: consecutive nodes with the same device[nodeID] form one.
// Each partition's sub-graph is built with the Graph builder, so it is validated like any
// other graph.
func SplitGraph(g *Graph, device []int) ([]*Partition, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	if len(device) != len(g.Nodes) {
		return nil, fmt.Errorf("split: %d devices for %d nodes: %w", len(device), len(g.Nodes), ErrInvalidArgument)
	}
	var parts []*Partition
	partOf := make([]int, len(g.Nodes)) // node ID -> partition index
	for i, n := range g.Nodes {
		if i == 0 || device[i] != device[i-1] {
			parts = append(parts, &Partition{Index: len(parts), Device: device[i]})
		}
		p := parts[len(parts)-1]
		p.Nodes = append(p.Nodes, n.ID)
		partOf[n.ID] = p.Index
	}

	// A value leaves its partition when a node of another partition reads it or it is a
	// graph output.
	leaves := make(map[*Tensor]bool)
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			if in.Kind == KindValue && partOf[in.Producer] != partOf[n.ID] {
				leaves[in] = true
			}
		}
	}
	for _, t := range g.Outputs {
		leaves[t] = true
	}

	for _, p := range parts {
		if err := p.build(g, partOf, leaves); err != nil {
			return nil, err
		}
	}
	return dropDead(parts), nil
}

// dropDead removes partitions none of whose results is used (dead code in the graph) and
// renumbers the rest. Nothing depends on a dead partition, by definition.
func dropDead(parts []*Partition) []*Partition {
	renum := make([]int, len(parts))
	live := parts[:0]
	for i, p := range parts {
		renum[i] = len(live)
		if p.Graph != nil {
			live = append(live, p)
		}
	}
	for _, p := range live {
		p.Index = renum[p.Index]
		for i, d := range p.Deps {
			p.Deps[i] = renum[d]
		}
	}
	return live
}

// build makes p's sub-graph from the original g.
func (p *Partition) build(g *Graph, partOf []int, leaves map[*Tensor]bool) error {
	sub := NewGraph()
	local := make(map[*Tensor]*Tensor) // original -> sub-graph tensor
	for _, id := range p.Nodes {
		n := g.Nodes[id]
		ins := make([]*Tensor, len(n.Inputs))
		for i, t := range n.Inputs {
			lt, ok := local[t]
			if !ok {
				switch {
				case t.Kind == KindConst:
					lt = sub.Const(t.Name, t.DType, t.Shape, t.Data)
				default: // a graph input, or a value made by an earlier partition
					lt = sub.Input(t.Name, t.DType, t.Shape...)
					p.Inputs = append(p.Inputs, t)
					if t.Kind == KindValue && !slices.Contains(p.Deps, partOf[t.Producer]) {
						p.Deps = append(p.Deps, partOf[t.Producer])
					}
				}
				local[t] = lt
			}
			ins[i] = lt
		}
		out := sub.add(nodeSpec{op: n.Op, name: n.Name, inputs: ins, iattr: n.IAttr, fattr: n.FAttr,
			outDType: n.Output.DType, outShape: n.Output.Shape})
		if err := sub.Err(); err != nil {
			return fmt.Errorf("partition %d: %w", p.Index, err)
		}
		if out.DType != n.Output.DType || !out.Shape.Equal(n.Output.Shape) {
			return fmt.Errorf("partition %d: %s: %w: output %s%s, original %s%s", p.Index, n, ErrGraph,
				out.DType, out.Shape, n.Output.DType, n.Output.Shape)
		}
		local[n.Output] = out
		if leaves[n.Output] {
			sub.Output(out)
			p.Outputs = append(p.Outputs, n.Output)
		}
	}
	slices.Sort(p.Deps)
	if len(p.Outputs) == 0 {
		return nil // dead: see dropDead
	}
	if err := sub.Validate(); err != nil {
		return fmt.Errorf("partition %d: %w", p.Index, err)
	}
	p.Graph = sub
	return nil
}
