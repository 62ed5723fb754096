package sched

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// TestPlaceStage: a stage's nodes go where the rules or the fixed units say, mapped to the
// caller's unit indices, with the split of a split MATMUL and the plan units used; bad unit
// indices are errors.
func TestPlaceStage(t *testing.T) {
	p, err := ParsePlan([]byte(`{"units":["neon{cpus=0}","opencl","qnn"],"prefill":{"rules":[
		{"layers":"0-3","split":{"strategy":"multiseq","units":["qnn","opencl"],"lengths":[256,32]}},
		{"unit":"0","ops":["MATMUL"],"split":{"strategy":"rows","units":["opencl","neon{cpus=0}"],"ratio":[0.7,0.3]}},
		{"unit":"0","fallback":"1"}]}}`))
	require.NoError(t, err)
	rp, err := p.Resolve()
	require.NoError(t, err)
	g := core.NewGraph()
	x := g.Input("x", core.F32, 2, 4)
	w := g.Const("w", core.F32, core.Shape{3, 4}, make([]byte, 48))
	h := g.Named("norm").Scale(x, 0.5, 0)
	g.Output(g.Named("neg").Neg(g.Named("attn_q").MatMul(h, w)))
	require.NoError(t, g.Err())

	for _, tc := range []struct {
		name     string
		layer    int
		fixed    map[int]int
		units    []int
		want     StagePlacement
		wantFail bool
	}{
		{name: "a layer split over two units", layer: 2, units: []int{0, 1, 2}, want: StagePlacement{
			Units: []int{2, 2, 2}, Fallback: []int{-1, -1, -1},
			Splits: []*NodeSplit{nil, {Strategy: SplitMultiSeq, Units: []int{2, 1}, Lengths: []int64{256, 32}, Merge: 2}, nil},
			Used:   map[int]bool{1: true, 2: true}}},
		{name: "mapped units and fallbacks", layer: 7, units: []int{5, 6, 7}, want: StagePlacement{
			Units: []int{5, 5, 5}, Fallback: []int{6, -1, 6},
			Splits: []*NodeSplit{nil, {Strategy: SplitRows, Units: []int{6, 5}, Ratio: []float64{0.7, 0.3}, Merge: 5}, nil},
			Used:   map[int]bool{0: true, 1: true}}},
		{name: "fixed nodes", layer: 7, fixed: map[int]int{0: 2, 2: 2}, units: []int{5, 6, 7}, want: StagePlacement{
			Units: []int{7, 5, 7}, Fallback: []int{-1, -1, -1},
			Splits: []*NodeSplit{nil, {Strategy: SplitRows, Units: []int{6, 5}, Ratio: []float64{0.7, 0.3}, Merge: 5}, nil},
			Used:   map[int]bool{0: true, 1: true, 2: true}}},
		{name: "too few unit indices", layer: 7, units: []int{0, 1}, wantFail: true},
		{name: "a fixed unit past the plan's", layer: 7, fixed: map[int]int{1: 3}, units: []int{0, 1, 2}, wantFail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rp.PlaceStage(PhasePrefill, g, func(*core.Node) int { return tc.layer }, tc.fixed, tc.units)
			if tc.wantFail {
				require.ErrorIs(t, err, core.ErrInvalidArgument)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
