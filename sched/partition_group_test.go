package sched

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// TestSplitGraphGrouped: split MATMULs (each its own pseudo device) grouped as one: the three
// come one after another and their consumers on device 0 form one partition, not three.
func TestSplitGraphGrouped(t *testing.T) {
	g := core.NewGraph()
	x := g.Input("x", core.F32, 1, 8)
	for i := range 3 {
		w := g.Const(fmt.Sprintf("w%d", i), core.F32, core.Shape{8, 8}, make([]byte, 8*8*4))
		g.Output(g.Neg(g.MatMul(x, w)))
	}
	require.NoError(t, g.Err())
	// nodes: mm0, neg0, mm1, neg1, mm2, neg2; the matmuls on pseudo devices 10, 12, 14
	device := []int{10, 0, 12, 0, 14, 0}
	group := []int{2, 0, 2, 0, 2, 0}
	devs := func(parts []*Partition) []int {
		var d []int
		for _, p := range parts {
			d = append(d, p.Device)
		}
		return d
	}
	plain, err := SplitGraph(g, device)
	require.NoError(t, err)
	assert.Equal(t, []int{10, 0, 12, 0, 14, 0}, devs(plain), "by device: each consumer a partition of its own")
	grouped, err := splitGraphGrouped(g, device, group, 2)
	require.NoError(t, err)
	assert.Equal(t, []int{10, 12, 14, 0}, devs(grouped), "grouped: the consumers in one partition")
	assert.Len(t, grouped[3].Nodes, 3)
}

// TestSplitGraphShardedLayer: a layer cut into two shards (unit 0 and unit 1 each run their
// share of a block and write a partial sum that unit 0 adds). Each unit's shard must be a
// partition that waits only for the shared input, and the add that needs both a partition of
// its own: otherwise unit 0's shard would wait for unit 1's (one partition holding it and the
// add) or unit 1's for unit 0's (the norm and unit 0's shard in one partition).
func TestSplitGraphShardedLayer(t *testing.T) {
	g := core.NewGraph()
	x := g.Input("x", core.F32, 1, 8)
	w := func(name string) *core.Tensor {
		return g.Const(name, core.F32, core.Shape{8, 8}, make([]byte, 8*8*4))
	}
	h := g.RMSNorm(x, 1e-5)                             // 0: unit 0
	a := g.MatMul(g.Neg(g.MatMul(h, w("a1"))), w("a2")) // 1-3: unit 0's shard
	b := g.MatMul(g.Neg(g.MatMul(h, w("b1"))), w("b2")) // 4-6: unit 1's shard
	y := g.Add(g.Add(x, a), b)                          // 7, 8: unit 0
	g.Output(g.MatMul(g.RMSNorm(y, 1e-5), w("c")))      // 9, 10: unit 0
	g.Output(g.MatMul(g.RMSNorm(y, 1e-5), w("d")))      // 11: unit 0, 12: unit 1
	require.NoError(t, g.Err())
	device := []int{0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1}
	parts, err := splitGraphGrouped(g, device, device, 2)
	require.NoError(t, err)
	var got [][]int
	for _, p := range parts {
		got = append(got, append([]int{p.Device}, p.Nodes...))
	}
	assert.Equal(t, [][]int{
		{0, 0},          // the norm: both shards wait for it only
		{1, 4, 5, 6},    // unit 1's shard
		{0, 1, 2, 3, 7}, // unit 0's shard and its own partial add
		{0, 8, 11},      // the add that needs unit 1's shard, and the norm unit 1 waits for
		{1, 12},         // unit 1's next matmul, as soon as the norm is done
		{0, 9, 10},
	}, got)
	for _, p := range parts {
		if p.Device == 1 {
			for _, d := range p.Deps {
				assert.NotContains(t, parts[d].Nodes, 3, "unit 1 never waits for unit 0's shard")
			}
		}
	}
}

// TestSharedPiecesChecked: a stage's shared pieces must name two distinct units and nodes of
// their own.
func TestSharedPiecesChecked(t *testing.T) {
	g := core.NewGraph()
	x := g.Input("x", core.F32, 1, 8)
	g.Output(g.Neg(g.Neg(x)))
	require.NoError(t, g.Err())
	for _, tc := range []struct {
		name   string
		shared [][]int
		units  [2]int
		splits []*NodeSplit
		msg    string
	}{
		{"same unit twice", [][]int{{0}, {1}}, [2]int{1, 1}, nil, "units [1 1]"},
		{"a unit past the runtime's", [][]int{{0}, {1}}, [2]int{0, 2}, nil, "units [0 2]"},
		{"an empty piece", [][]int{{0}, {}}, [2]int{0, 1}, nil, "an empty piece"},
		{"a node in two pieces", [][]int{{0}, {0, 1}}, [2]int{0, 1}, nil, "node 0"},
		{"a node past the graph's", [][]int{{0}, {5}}, [2]int{0, 1}, nil, "node 5"},
		{"a split node", [][]int{{0}, {1}}, [2]int{0, 1}, []*NodeSplit{nil, {Strategy: SplitRows}}, "node 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkShared(StageSpec{Name: "s", Graph: g, Shared: tc.shared, SharedUnits: tc.units}, tc.splits, 2)
			require.ErrorIs(t, err, core.ErrInvalidArgument)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
	assert.NoError(t, checkShared(StageSpec{Name: "s", Graph: g, Shared: [][]int{{0}, {1}}, SharedUnits: [2]int{1, 0}}, nil, 2))
}
