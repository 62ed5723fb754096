package sched

import (
	"container/heap"
	"fmt"
	"math"
	"slices"

	"github.com/xpuhub/xpu/core"
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
	Graph *core.Graph
	// Inputs and Outputs are the original graph's tensors.
	Inputs  []*core.Tensor
	Outputs []*core.Tensor
	// Deps are the indices of the partitions that produce this one's inputs.
	Deps []int
}

// SplitGraph cuts g into partitions: consecutive nodes with the same device[nodeID] form one.
// Nodes are first put in a device-grouping topological order (see groupByDevice), so
// independent nodes on one device end up in one partition. Each partition's sub-graph is built
// with the Graph builder, so it is validated like any other graph.
func SplitGraph(g *core.Graph, device []int) ([]*Partition, error) {
	return splitGraphGrouped(g, device, device, 0)
}

// splitGraphGrouped is SplitGraph with the node order grouped by group[nodeID] instead of by
// device: nodes of different devices in one group are ordered as if on one device, then cut
// by device. The runtime gives every split MATMUL a pseudo device of its own but puts them in
// one group, so a layer's Q, K and V splits come one after another and the nodes that consume
// them (reshapes, RoPE) form one partition instead of one each.
//
// Devices below real are units whose shards run at once (StageSpec.Sharded; 0 for other
// stages: none), and those from real on the runtime's pseudo devices. Between units the cut
// then keeps them concurrent: the order hands over to a unit as soon as a node
// there becomes ready (groupByDevice), and a partition ends before a node that would make it
// wait for another unit's partition it did not wait for already, so that its earlier nodes
// run while that unit works (a sharded layer: unit 0's FFN shard, then the residual add that
// needs unit 1's shard, is two partitions, not one that waits for unit 1 before starting).
func splitGraphGrouped(g *core.Graph, device, group []int, real int) ([]*Partition, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	if len(device) != len(g.Nodes) || len(group) != len(g.Nodes) {
		return nil, fmt.Errorf("split: %d devices for %d nodes: %w", len(device), len(g.Nodes), core.ErrInvalidArgument)
	}
	var parts []*Partition
	partOf := make([]int, len(g.Nodes)) // node ID -> partition index
	var waits []int                     // the current partition's producer partitions on other units
	for i, id := range groupByDevice(g, group, real) {
		if i == 0 || device[id] != parts[len(parts)-1].Device || waitsMore(g.Nodes[id], partOf, parts, waits, real) {
			parts = append(parts, &Partition{Index: len(parts), Device: device[id]})
			waits = waits[:0]
		}
		p := parts[len(parts)-1]
		p.Nodes = append(p.Nodes, id)
		partOf[id] = p.Index
		for _, in := range g.Nodes[id].Inputs {
			if in.Kind == core.KindValue {
				if q := partOf[in.Producer]; q != p.Index && !slices.Contains(waits, q) {
					waits = append(waits, q)
				}
			}
		}
	}

	// A value leaves its partition when a node of another partition reads it or it is a
	// graph output.
	leaves := make(map[*core.Tensor]bool)
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			if in.Kind == core.KindValue && partOf[in.Producer] != partOf[n.ID] {
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

// waitsMore reports whether node n, added to the last of parts (which waits for the
// partitions in waits), would make it wait for another unit's partition as well. Pseudo devices
// (from real on) do not count: a split node's parts are placed later, and the nodes that
// consume several splits (a layer's Q, K and V) belong in one partition.
func waitsMore(n *core.Node, partOf []int, parts []*Partition, waits []int, real int) bool {
	cur := parts[len(parts)-1]
	if cur.Device >= real {
		return false
	}
	for _, in := range n.Inputs {
		if in.Kind != core.KindValue {
			continue
		}
		q := parts[partOf[in.Producer]]
		if q != cur && q.Device < real && q.Device != cur.Device && !slices.Contains(waits, q.Index) {
			return true
		}
	}
	return false
}

// groupByDevice returns a topological order of g's nodes that stays on one device as long as
// some node there is ready, switching to the device of the earliest ready node otherwise. In a
// transformer block with only the matmuls offloaded this turns the Q, K and V projections into
// one partition instead of three, and with them the copies between partitions. When a node
// makes a node of another unit (a device below real) ready, the order goes to that unit at
// once, so that the unit's partition waits for what it needs and no more.
func groupByDevice(g *core.Graph, device []int, real int) []int {
	pending := make([]int, len(g.Nodes)) // inputs not yet produced
	users := make([][]int, len(g.Nodes)) // producer -> consumers, once per consumer
	for _, n := range g.Nodes {
		seen := map[int]bool{}
		for _, in := range n.Inputs {
			if in.Kind == core.KindValue && !seen[in.Producer] {
				seen[in.Producer] = true
				pending[n.ID]++
				users[in.Producer] = append(users[in.Producer], n.ID)
			}
		}
	}
	// Among ready nodes a node another unit waits for comes first (its key is its ID less the
	// node count), so that the unit's wait ends as early as it can.
	nn := len(g.Nodes)
	key := make([]int, nn)
	for _, n := range g.Nodes {
		key[n.ID] = n.ID
		if device[n.ID] < real {
			for _, u := range users[n.ID] {
				if device[u] != device[n.ID] && device[u] < real {
					key[n.ID] -= nn
					break
				}
			}
		}
	}
	ready := map[int]*idHeap{} // device -> ready nodes' keys
	push := func(id int) {
		h := ready[device[id]]
		if h == nil {
			h = &idHeap{}
			ready[device[id]] = h
		}
		heap.Push(h, key[id])
	}
	for _, n := range g.Nodes {
		if pending[n.ID] == 0 {
			push(n.ID)
		}
	}
	order := make([]int, 0, len(g.Nodes))
	cur := -1
	for len(order) < len(g.Nodes) {
		if h := ready[cur]; h == nil || h.Len() == 0 {
			first := math.MaxInt // the earliest ready node's key on any device
			for d, h := range ready {
				if h.Len() > 0 && (*h)[0] < first {
					first, cur = (*h)[0], d
				}
			}
		}
		id := heap.Pop(ready[cur]).(int)
		if id < 0 {
			id += nn
		}
		order = append(order, id)
		next := cur
		for _, u := range users[id] {
			if pending[u]--; pending[u] == 0 {
				push(u)
				if d := device[u]; d != cur && d < real && cur < real && next == cur {
					next = d
				}
			}
		}
		cur = next
	}
	return order
}

// idHeap is a min-heap of node IDs: among ready nodes, the original order wins.
type idHeap []int

func (h idHeap) Len() int           { return len(h) }
func (h idHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h idHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *idHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *idHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
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
func (p *Partition) build(g *core.Graph, partOf []int, leaves map[*core.Tensor]bool) error {
	sub := core.NewGraph()
	local := make(map[*core.Tensor]*core.Tensor) // original -> sub-graph tensor
	for _, id := range p.Nodes {
		n := g.Nodes[id]
		ins := make([]*core.Tensor, len(n.Inputs))
		for i, t := range n.Inputs {
			lt, ok := local[t]
			if !ok {
				switch {
				case t.Kind == core.KindConst:
					lt = sub.Const(t.Name, t.DType, t.Shape, t.Data)
				default: // a graph input, or a value made by an earlier partition
					lt = sub.Input(t.Name, t.DType, t.Shape...)
					p.Inputs = append(p.Inputs, t)
					if t.Kind == core.KindValue && !slices.Contains(p.Deps, partOf[t.Producer]) {
						p.Deps = append(p.Deps, partOf[t.Producer])
					}
				}
				local[t] = lt
			}
			ins[i] = lt
		}
		out := sub.CopyNode(n, ins...)
		if err := sub.Err(); err != nil {
			return fmt.Errorf("partition %d: %w", p.Index, err)
		}
		if out.DType != n.Output.DType || !out.Shape.Equal(n.Output.Shape) {
			return fmt.Errorf("partition %d: %s: %w: output %s%s, original %s%s", p.Index, n, core.ErrGraph,
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
