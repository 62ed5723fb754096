package ref

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// TestMalformedGraphs edits built graphs by hand, as a deserializer bug might: every edit must
// give ErrGraph, never a panic.
func TestMalformedGraphs(t *testing.T) {
	build := func() (*core.Graph, *core.Tensor, *core.Tensor) {
		g := core.NewGraph()
		x := g.Input("x", core.F32, 2, 3)
		w := c32(g, core.Shape{3}, 1, 2, 3)
		y := g.Permute(g.Mul(x, w), 1, 0)
		g.Output(y)
		require.NoError(t, g.Err())
		return g, x, w
	}
	tests := []struct {
		name string
		edit func(g *core.Graph, x, w *core.Tensor)
	}{
		{"rank above 4", func(g *core.Graph, x, w *core.Tensor) { x.Shape = core.Shape{1, 1, 1, 1, 1, 1, 1, 1, 1, 6} }},
		{"negative dims", func(g *core.Graph, x, w *core.Tensor) { x.Shape = core.Shape{-2, -3} }},
		{"short constant", func(g *core.Graph, x, w *core.Tensor) { w.Data = w.Data[:4] }},
		{"invalid dtype", func(g *core.Graph, x, w *core.Tensor) { w.DType = 42 }},
		{"unknown kind", func(g *core.Graph, x, w *core.Tensor) { w.Kind = 9 }},
		{"nil node", func(g *core.Graph, x, w *core.Tensor) { g.Nodes[0] = nil }},
		{"nil output", func(g *core.Graph, x, w *core.Tensor) { g.Nodes[1].Output = nil }},
		{"nil input", func(g *core.Graph, x, w *core.Tensor) { g.Nodes[0].Inputs[1] = nil }},
		{"foreign input", func(g *core.Graph, x, w *core.Tensor) {
			g.Nodes[0].Inputs[0] = &core.Tensor{ID: 0, DType: core.F32, Shape: core.Shape{2, 3}}
		}},
		{"nil tensor", func(g *core.Graph, x, w *core.Tensor) { g.Tensors[1] = nil }},
		{"out of order", func(g *core.Graph, x, w *core.Tensor) { g.Nodes[0], g.Nodes[1] = g.Nodes[1], g.Nodes[0] }},
		{"input not listed", func(g *core.Graph, x, w *core.Tensor) { g.Inputs = nil }},
		{"output is an input", func(g *core.Graph, x, w *core.Tensor) { g.Outputs = []*core.Tensor{x} }},
		{"bad perm", func(g *core.Graph, x, w *core.Tensor) { g.Nodes[1].IAttr[0] = 7 }},
		{"wrong output shape", func(g *core.Graph, x, w *core.Tensor) { g.Nodes[0].Output.Shape = core.Shape{6} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, x, w := build()
			tc.edit(g, x, w)
			_, err := Run(context.Background(), g, [][]byte{make([]byte, 24)})
			require.Error(t, err)
			assert.True(t, errors.Is(err, core.ErrGraph), "%v", err)
			_, err = newContext(t).Analyze(context.Background(), g)
			assert.ErrorIs(t, err, core.ErrGraph)
		})
	}
}

// FuzzRunData feeds arbitrary execution-time data to the ops that index with it (GET_ROWS ids,
// ATTENTION's q_offset): a bad id is ErrInvalidArgument, and nothing panics.
func FuzzRunData(f *testing.F) {
	f.Add(int32(0), int32(1), int32(0))
	f.Add(int32(-1), int32(3), int32(-100))
	f.Add(int32(2), int32(1<<30), int32(1<<31-1))
	f.Fuzz(func(t *testing.T, id0, id1, qoff int32) {
		g := core.NewGraph()
		ids := g.Input("ids", core.I32, 2)
		off := g.Input("q_offset", core.I32, 1)
		emb := g.GetRows(c16(g, core.Shape{3, 4}, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), ids)
		q := g.Reshape(emb, 2, 2, 2)
		kv := g.Const("kv", core.F32, core.Shape{3, 1, 2}, core.EncodeF32([]float32{1, 0, 0, 1, nan, nan}))
		g.Output(g.Attention(q, kv, kv, core.AttentionOptions{Causal: true, QOffsetInput: off}))
		if err := g.Err(); err != nil {
			t.Fatal(err)
		}
		var in [12]byte
		binary.LittleEndian.PutUint32(in[0:], uint32(id0))
		binary.LittleEndian.PutUint32(in[4:], uint32(id1))
		binary.LittleEndian.PutUint32(in[8:], uint32(qoff))
		out, err := Run(context.Background(), g, [][]byte{in[:8], in[8:]})
		if id0 < 0 || id0 > 2 || id1 < 0 || id1 > 2 {
			if !errors.Is(err, core.ErrInvalidArgument) {
				t.Fatalf("ids %d, %d: got %v, want ErrInvalidArgument", id0, id1, err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		// Key row 2 (NaN) is visible only when q_offset >= 1 (query 1 then sees keys 0..2).
		for i, v := range core.DecodeF32(out[0]) {
			if v != v && qoff < 1 {
				t.Fatalf("value %d is NaN with q_offset %d: a masked row was read", i, qoff)
			}
		}
	})
}
