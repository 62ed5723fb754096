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
	grouped, err := splitGraphGrouped(g, device, group)
	require.NoError(t, err)
	assert.Equal(t, []int{10, 12, 14, 0}, devs(grouped), "grouped: the consumers in one partition")
	assert.Len(t, grouped[3].Nodes, 3)
}
