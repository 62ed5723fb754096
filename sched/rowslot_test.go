package sched

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

// TestRuntimeRowSlots: bindings with a RowSlot move by their own row of Chunk.Rows (a batched
// step's sequences each read and write their own rows), the others by Chunk.Row, and a slot the
// chunk lacks fails the run.
func TestRuntimeRowSlots(t *testing.T) {
	rb := ref.New()
	defer rb.Close()
	rt, err := NewRuntime(context.Background(), rb.Devices(), []UnitSpec{{Backend: "ref"}})
	require.NoError(t, err)
	defer rt.Close()
	const n = 4
	g := core.NewGraph()
	a, b := g.Input("a", core.F32, n), g.Input("b", core.F32, n)
	g.Output(g.Neg(a), g.Neg(b))
	require.NoError(t, g.Err())
	alloc := func(rows int64) Span {
		s, err := rt.Arena().Alloc(rows * n * 4)
		require.NoError(t, err)
		return s
	}
	in, out := alloc(8), alloc(8)
	vals := make([]float32, 8*n)
	for i := range vals {
		vals[i] = float32(i)
	}
	copy(rt.Arena().Bytes(in), core.EncodeF32(vals))
	p, err := rt.Compile(context.Background(), ProgramSpec{Name: "p", Stages: []StageSpec{{Name: "s", Graph: g,
		Units: []int{0, 0}, IO: []Binding{{Span: in, Stride: n * 4, RowSlot: 1}, {Span: in, Stride: n * 4},
			{Span: out, Stride: n * 4, RowSlot: 2}, {Span: out, Stride: n * 4, RowSlot: 3}}}}})
	require.NoError(t, err)

	tests := []struct {
		name          string
		chunk         Chunk
		aRow, bRow    int64 // rows read
		outA, outB    int64 // rows written
		wantErrSubstr string
	}{
		{name: "own rows", chunk: Chunk{Row: 1, Rows: []int64{6, 2, 5}}, aRow: 6, bRow: 1, outA: 2, outB: 5},
		{name: "same row", chunk: Chunk{Row: 3, Rows: []int64{3, 3, 7}}, aRow: 3, bRow: 3, outA: 3, outB: 7},
		{name: "missing slot", chunk: Chunk{Row: 0, Rows: []int64{1}}, wantErrSubstr: "row slot 2"},
		{name: "slot row outside", chunk: Chunk{Row: 0, Rows: []int64{100, 0, 0}}, wantErrSubstr: "outside its span"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clear(rt.Arena().Bytes(out))
			err := p.Run(context.Background(), []Chunk{tc.chunk})
			if tc.wantErrSubstr != "" {
				require.ErrorIs(t, err, core.ErrInvalidArgument)
				assert.Contains(t, err.Error(), tc.wantErrSubstr)
				return
			}
			require.NoError(t, err)
			got := core.DecodeF32(rt.Arena().Bytes(out)[:8*n*4])
			for i := range int64(n) {
				assert.Equal(t, -vals[tc.aRow*n+i], got[tc.outA*n+i], "a, element %d", i)
				assert.Equal(t, -vals[tc.bRow*n+i], got[tc.outB*n+i], "b, element %d", i)
			}
		})
	}
	_, err = rt.Compile(context.Background(), ProgramSpec{Name: "bad", Stages: []StageSpec{{Name: "s", Graph: g,
		Units: []int{0, 0}, IO: []Binding{{Span: in, RowSlot: -1}, {Span: in}, {Span: out}, {Span: out}}}}})
	require.ErrorIs(t, err, core.ErrInvalidArgument)
}
