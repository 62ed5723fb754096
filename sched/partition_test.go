package sched_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

func names(ts []*core.Tensor) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Name
	}
	return out
}

func TestSplitGraph(t *testing.T) {
	// x -> a=scale(x) -> b=silu(a) -> c=add(b, w) -> out c, plus d=scale(a) as a second output
	g := core.NewGraph()
	x := g.Input("x", core.F32, 4)
	w := g.Const("w", core.F32, core.Shape{4}, core.EncodeF32([]float32{1, 2, 3, 4}))
	a := g.Named("a").Scale(x, 2, 0)
	b := g.Named("b").SiLU(a)
	c := g.Named("c").Add(b, w)
	d := g.Named("d").Scale(a, 3, 0)
	e := g.Named("e").Mul(d, w)
	g.Output(c, e)
	require.NoError(t, g.Err())

	tests := []struct {
		name    string
		device  []int
		nodes   [][]string
		inputs  [][]string
		outputs [][]string
		deps    [][]int
	}{
		{"one device", []int{0, 0, 0, 0, 0},
			[][]string{{"a", "b", "c", "d", "e"}}, [][]string{{"x"}}, [][]string{{"c", "e"}}, [][]int{nil}},
		{"middle offloaded", []int{0, 1, 0, 0, 0},
			// d and e only need a: they stay with it on device 0 while b runs elsewhere
			[][]string{{"a", "d", "e"}, {"b"}, {"c"}},
			[][]string{{"x"}, {"a"}, {"b"}},
			[][]string{{"a", "e"}, {"b"}, {"c"}},
			[][]int{nil, {0}, {1}}},
		{"independent nodes grouped", []int{0, 1, 0, 1, 1},
			// d only needs a: it joins b on device 1, before c
			[][]string{{"a"}, {"b", "d", "e"}, {"c"}},
			[][]string{{"x"}, {"a"}, {"b"}},
			[][]string{{"a"}, {"b", "e"}, {"c"}},
			[][]int{nil, {0}, {1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parts, err := sched.SplitGraph(g, tt.device)
			require.NoError(t, err)
			require.Len(t, parts, len(tt.nodes))
			for i, p := range parts {
				assert.Equal(t, i, p.Index)
				var got []string
				for _, id := range p.Nodes {
					got = append(got, g.Nodes[id].Name)
					assert.Equal(t, tt.device[id], p.Device)
				}
				assert.Equal(t, tt.nodes[i], got, "partition %d nodes", i)
				assert.Equal(t, tt.inputs[i], names(p.Inputs), "partition %d inputs", i)
				assert.Equal(t, tt.outputs[i], names(p.Outputs), "partition %d outputs", i)
				assert.Equal(t, tt.deps[i], p.Deps, "partition %d deps", i)
				require.NoError(t, p.Graph.Validate())
				assert.Equal(t, names(p.Inputs), names(p.Graph.Inputs))
				assert.Equal(t, names(p.Outputs), names(p.Graph.Outputs))
				for j, in := range p.Graph.Inputs {
					assert.Equal(t, p.Inputs[j].Shape, in.Shape)
					assert.Equal(t, p.Inputs[j].DType, in.DType)
				}
				for _, st := range p.Graph.Tensors {
					if st.Kind == core.KindConst {
						assert.Same(t, &w.Data[0], &st.Data[0], "constants are shared, not copied")
					}
				}
			}
		})
	}
}

func TestSplitGraphDropsDeadCode(t *testing.T) {
	g := core.NewGraph()
	x := g.Input("x", core.F32, 4)
	y := g.Named("used").Scale(x, 2, 0)
	g.Named("dead").SiLU(x)
	g.Output(g.Named("last").Neg(y))
	require.NoError(t, g.Err())
	parts, err := sched.SplitGraph(g, []int{0, 1, 0})
	require.NoError(t, err)
	require.Len(t, parts, 1)
	assert.Equal(t, []int{0, 2}, parts[0].Nodes)
	assert.Equal(t, 0, parts[0].Index)
}

func TestSplitGraphErrors(t *testing.T) {
	g := core.NewGraph()
	x := g.Input("x", core.F32, 4)
	g.Output(g.Neg(x))
	_, err := sched.SplitGraph(g, []int{0, 0})
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	_, err = sched.SplitGraph(core.NewGraph(), nil)
	assert.ErrorIs(t, err, core.ErrGraph)
}
