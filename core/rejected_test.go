package core

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every hand-built node of the table breaks a rule InferOutput states: Validate refuses it. The
// conformance suite sends the same graphs to every backend (abi/xpu_validate.h's agreement).
func TestRejectedNodesAreRejected(t *testing.T) {
	cases := RejectedNodes()
	require.NotEmpty(t, cases)
	seen := map[string]bool{}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			assert.False(t, seen[c.Name], "duplicate name")
			seen[c.Name] = true
			require.Len(t, c.Graph.Nodes, 1)
			assert.NotPanics(t, func() { c.Graph.Opset() }, "a hand-built graph is encoded with its op set")
			err := c.Graph.Validate()
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrGraph), "%v", err)
		})
	}
}

// The Go rules agree with the C ones on inputs the old InferOutput let through: ATTENTION's
// q_offset is checked when a mask follows it, and a NaN i8 quantize scale is not positive.
func TestInferOutputEdgeRules(t *testing.T) {
	g := NewGraph()
	q := g.Input("q", F32, 2, 4, 4)
	k := g.Input("k", F32, 3, 4, 4)
	v := g.Input("v", F32, 3, 4, 4)
	qo := g.Input("qo", F32, 1)
	m := g.Input("m", I8, 2, 2)
	n := &Node{Op: OpAttention, Inputs: []*Tensor{q, k, v, qo, m}}
	n.IAttr[0] = 1
	_, _, err := InferOutput(n, 0, nil)
	assert.ErrorContains(t, err, "q_offset")

	x := g.Input("x", F32, 4)
	nq := &Node{Op: OpQuantize, Inputs: []*Tensor{x}}
	nq.FAttr[0] = float32(math.NaN())
	_, _, err = InferOutput(nq, I8, nil)
	assert.ErrorContains(t, err, "positive scale")
}
