package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCopyNode(t *testing.T) {
	src := NewGraph()
	x := src.Input("x", F32, 2, 8)
	src.Output(src.Reshape(src.Scale(src.RMSNorm(x, 1e-5), 2, 1), 4, 4))
	require.NoError(t, src.Err())

	dst := NewGraph()
	in := dst.Input("x", F32, 2, 8)
	cur := in
	for _, n := range src.Nodes {
		cur = dst.CopyNode(n, cur)
		require.NoError(t, dst.Err())
		assert.Equal(t, n.Name, cur.Name, "the node keeps its name")
		assert.Equal(t, n.Output.DType, cur.DType)
		assert.True(t, n.Output.Shape.Equal(cur.Shape), "%s vs %s", n.Output.Shape, cur.Shape)
		got := dst.Nodes[len(dst.Nodes)-1]
		assert.Equal(t, n.Op, got.Op)
		assert.Equal(t, n.IAttr, got.IAttr)
		assert.Equal(t, n.FAttr, got.FAttr)
	}
	dst.Output(cur)
	require.NoError(t, dst.Validate())

	tests := []struct {
		name string
		copy func(g *Graph) *Tensor
	}{
		{"nil node", func(g *Graph) *Tensor { return g.CopyNode(nil) }},
		{"wrong input shape", func(g *Graph) *Tensor { return g.CopyNode(src.Nodes[2], g.Input("y", F32, 3, 8)) }},
		{"foreign input", func(g *Graph) *Tensor { return g.CopyNode(src.Nodes[0], x) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewGraph()
			assert.Nil(t, tt.copy(g))
			assert.ErrorIs(t, g.Err(), ErrGraph)
		})
	}
}
