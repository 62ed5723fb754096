package core

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestQueryForWeightDType: a backend answers MATMUL and SPARSE_FFN by their weight's dtype (the
// bundles for SPARSE_FFN), so a Q4_0 cache is not mistaken for an F32 one.
func TestQueryForWeightDType(t *testing.T) {
	g := NewGraph()
	x := g.Input("x", F32, 1, 32)
	mm := g.MatMul(x, g.Input("w", Q8_0, 4, 32))
	sf := g.SparseFFN(x, g.Input("b", Q4_0, 8, 96), g.Input("idx", I32, 3), SparseFFNOptions{})
	g.Output(mm)
	g.Output(sf)
	require.NoError(t, g.Err())
	q := QueryFor(g.Nodes[mm.Producer])
	assert.Equal(t, OpQuery{Op: OpMatMul, DTypeIn: F32, DTypeWeight: Q8_0, DTypeOut: F32, Rank: 2}, q)
	q = QueryFor(g.Nodes[sf.Producer])
	assert.Equal(t, OpQuery{Op: OpSparseFFN, DTypeIn: F32, DTypeWeight: Q4_0, DTypeOut: F32, Rank: 2}, q)
}
