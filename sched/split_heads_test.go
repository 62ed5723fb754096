package sched

import (
	"context"
	"errors"

	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/loader"
)

// headGraph is q [tq, 8, 16] over a cache of 40 rows of 4 KV heads (2 query heads each),
// causal from a run-time q_offset; y = ATTENTION (node 0), z = -y.
func headGraph(t *testing.T, tq int64) *core.Graph {
	t.Helper()
	g := core.NewGraph()
	q := g.Input("q", core.F32, tq, 8, 16)
	k := g.Input("k_cache", core.F32, 40, 4, 16)
	v := g.Input("v_cache", core.F32, 40, 4, 16)
	off := g.Input("q_offset", core.I32, 1)
	y := g.Named("attn").Attention(q, k, v, core.AttentionOptions{Causal: true, QOffsetInput: off})
	g.Output(y, g.Named("z").Neg(y))
	require.NoError(t, g.Err())
	return g
}

// runHeads compiles g with its ATTENTION split by sp (nil: whole on unit 0), runs it at
// q_offset 30 and returns y, z and the program. The cache rows past the visible ones are NaN:
// no part may read them.
func runHeads(t *testing.T, rt *Runtime, g *core.Graph, sp *NodeSplit) ([]float32, []float32, *Program) {
	t.Helper()
	a := rt.Arena()
	var io []Binding
	for i, tn := range append(append([]*core.Tensor(nil), g.Inputs...), g.Outputs...) {
		s, err := a.Alloc(tn.Bytes())
		require.NoError(t, err)
		io = append(io, Binding{Span: s})
		switch i {
		case 0, 1, 2:
			vals := make([]float32, tn.Shape.NumElements())
			for j := range vals {
				vals[j] = float32((j*(5+2*i))%17-8) / 8
			}
			if i > 0 {
				row := tn.Shape[1] * tn.Shape[2]
				for j := (30 + g.Inputs[0].Shape[0]) * row; j < int64(len(vals)); j++ {
					vals[j] = float32(math.NaN())
				}
			}
			copy(a.Bytes(s), core.EncodeF32(vals))
		case 3:
			copy(a.Bytes(s), core.EncodeI32([]int32{30}))
		}
	}
	st := StageSpec{Name: "s", Graph: g, Units: []int{0, 0}, IO: io}
	if sp != nil {
		st.Splits = []*NodeSplit{sp, nil}
	}
	p, err := rt.Compile(context.Background(), ProgramSpec{Name: "heads", Phase: PhaseDecode, Stages: []StageSpec{st}})
	require.NoError(t, err)
	require.NoError(t, p.Run(context.Background(), []Chunk{{}}))
	n := g.Outputs[0].Bytes()
	return core.DecodeF32(a.Bytes(io[4].Span)[:n]), core.DecodeF32(a.Bytes(io[5].Span)[:n]), p
}

func headCases(two []int) []struct {
	name  string
	tq    int64
	sp    *NodeSplit
	parts bool
} {
	return []struct {
		name  string
		tq    int64
		sp    *NodeSplit
		parts bool
	}{
		{"decode halves", 1, &NodeSplit{Strategy: SplitHeads, Units: two, Ratio: []float64{0.5, 0.5}, Merge: two[0]}, true},
		{"decode 1:3", 1, &NodeSplit{Strategy: SplitHeads, Units: two, Ratio: []float64{0.25, 0.75}, Merge: two[0]}, true},
		{"chunk of 3 rows runs whole", 3, &NodeSplit{Strategy: SplitHeads, Units: two, Ratio: []float64{0.5, 0.5}, Merge: two[1]}, false},
	}
}

// TestHeadSplitMatchesWhole: an ATTENTION split by KV heads gives, bit for bit on the
// reference, what the whole node gives; a decode row runs a part on each unit, a chunk of
// several rows runs whole on the split's merge unit.
func TestHeadSplitMatchesWhole(t *testing.T) {
	rb := ref.New()
	defer rb.Close()
	specs := []UnitSpec{{Backend: "ref"}, {Backend: "ref", Options: map[string]string{"u": "1"}},
		{Backend: "ref", Options: map[string]string{"u": "2"}}}
	rt, err := NewRuntime(context.Background(), rb.Devices(), specs)
	require.NoError(t, err)
	defer func() { require.NoError(t, rt.Close()) }()
	for _, c := range headCases([]int{1, 2}) {
		t.Run(c.name, func(t *testing.T) {
			g := headGraph(t, c.tq)
			wantY, wantZ, p0 := runHeads(t, rt, g, nil)
			gotY, gotZ, p := runHeads(t, rt, g, c.sp)
			for _, w := range wantY {
				require.False(t, math.IsNaN(float64(w)), "the whole node read a NaN row")
			}
			assert.Equal(t, wantY, gotY)
			assert.Equal(t, wantZ, gotZ)
			units := p.UnitNodes()
			if c.parts {
				assert.Positive(t, units[1], "unit 1 runs a part")
				assert.Positive(t, units[2], "unit 2 runs a part")
			} else {
				assert.Zero(t, units[1]+units[2]-units[c.sp.Merge], "only the merge unit runs the node")
				assert.Positive(t, units[c.sp.Merge])
			}
			require.NoError(t, p.Close())
			require.NoError(t, p0.Close())
		})
	}
}

// TestHeadSplitOnNeon: the same over two pinned neon units, against the reference.
func TestHeadSplitOnNeon(t *testing.T) {
	ctx := context.Background()
	b, err := loader.Open(ctx, "neon")
	if errors.Is(err, core.ErrNotFound) {
		required.Skip(t, "neon", "the neon plugin is not built or cannot run here (run make): %v", err)
	}
	require.NoError(t, err)
	defer b.Close()
	rb := ref.New()
	defer rb.Close()
	refRT, err := NewRuntime(ctx, rb.Devices(), []UnitSpec{{Backend: "ref"}})
	require.NoError(t, err)
	defer refRT.Close()
	rt, err := NewRuntime(ctx, b.Devices(), []UnitSpec{
		{Backend: "neon", Options: map[string]string{"cpus": "0", "threads": "1"}},
		{Backend: "neon", Options: map[string]string{"cpus": "1", "threads": "1"}}})
	require.NoError(t, err)
	defer func() { require.NoError(t, rt.Close()) }()
	for _, c := range headCases([]int{0, 1}) {
		t.Run(c.name, func(t *testing.T) {
			g := headGraph(t, c.tq)
			wantY, _, p0 := runHeads(t, refRT, g, nil)
			gotY, gotZ, p := runHeads(t, rt, g, c.sp)
			for i := range wantY {
				require.InDelta(t, wantY[i], gotY[i], 1e-4*max(1, math.Abs(float64(wantY[i]))), "y[%d]", i)
				require.Equal(t, -gotY[i], gotZ[i], "z[%d]", i)
			}
			if c.parts {
				units := p.UnitNodes()
				assert.Positive(t, units[0])
				assert.Positive(t, units[1])
			}
			require.NoError(t, p.Close())
			require.NoError(t, p0.Close())
		})
	}
}

// TestHeadSplitRejects: heads splits only ATTENTION, and ATTENTION splits only by heads.
func TestHeadSplitRejects(t *testing.T) {
	rb := ref.New()
	defer rb.Close()
	rt, err := NewRuntime(context.Background(), rb.Devices(),
		[]UnitSpec{{Backend: "ref"}, {Backend: "ref", Options: map[string]string{"u": "1"}}})
	require.NoError(t, err)
	defer func() { require.NoError(t, rt.Close()) }()
	two := []int{0, 1}
	for _, c := range []struct {
		name string
		g    *core.Graph
		at   int
		sp   *NodeSplit
		want string
	}{
		{"rows on an ATTENTION", headGraph(t, 1), 0, &NodeSplit{Strategy: SplitRows, Units: two, Ratio: []float64{0.5, 0.5}},
			"an ATTENTION splits by heads only, not rows"},
		{"heads on a MATMUL", splitGraph(t, 1, 64, 96, core.F32), 1, &NodeSplit{Strategy: SplitHeads, Units: two, Ratio: []float64{0.5, 0.5}},
			"heads splits MATMUL nodes only"},
		{"heads on a NEG", headGraph(t, 1), 1, &NodeSplit{Strategy: SplitHeads, Units: two, Ratio: []float64{0.5, 0.5}},
			"heads splits MATMUL nodes only"},
	} {
		t.Run(c.name, func(t *testing.T) {
			splits := make([]*NodeSplit, len(c.g.Nodes))
			splits[c.at] = c.sp
			io := make([]Binding, len(c.g.Inputs)+len(c.g.Outputs))
			for i, tn := range append(append([]*core.Tensor(nil), c.g.Inputs...), c.g.Outputs...) {
				s, err := rt.Arena().Alloc(tn.Bytes())
				require.NoError(t, err)
				io[i] = Binding{Span: s}
			}
			st := StageSpec{Name: "s", Graph: c.g, Units: make([]int, len(c.g.Nodes)), IO: io, Splits: splits}
			_, err := rt.Compile(context.Background(), ProgramSpec{Name: "bad", Phase: PhaseDecode, Stages: []StageSpec{st}})
			require.ErrorIs(t, err, core.ErrInvalidArgument)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	_, err = SplitParts(SplitHeads, 1, 64, []float64{0.5, 0.5}, nil)
	require.ErrorIs(t, err, core.ErrInvalidArgument)

}
