package loader

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/required"
)

// runGraph prepares g on device 0 of be, writes inputs, runs and returns the outputs' bytes.
func runGraph(t *testing.T, be core.Backend, g *core.Graph, inputs [][]byte) [][]byte {
	t.Helper()
	ctx := context.Background()
	cx, err := be.Devices()[0].NewContext(ctx, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, cx.Close()) }()
	exe, err := cx.Prepare(ctx, g)
	require.NoError(t, err)
	defer func() { require.NoError(t, exe.Close()) }()
	ex, err := exe.NewExecution()
	require.NoError(t, err)
	defer func() { require.NoError(t, ex.Close()) }()
	var bufs []core.Buffer
	defer func() {
		for _, b := range bufs {
			require.NoError(t, b.Close())
		}
	}()
	for i, in := range g.Inputs {
		b, err := cx.Alloc(in.Bytes(), core.BufferDevice)
		require.NoError(t, err)
		bufs = append(bufs, b)
		require.NoError(t, b.Write(0, inputs[i]))
		require.NoError(t, ex.Bind(i, b, 0))
	}
	for i, out := range g.Outputs {
		b, err := cx.Alloc(out.Bytes(), core.BufferDevice)
		require.NoError(t, err)
		bufs = append(bufs, b)
		require.NoError(t, ex.Bind(len(g.Inputs)+i, b, 0))
	}
	require.NoError(t, ex.Run(ctx))
	outs := make([][]byte, len(g.Outputs))
	for i, out := range g.Outputs {
		outs[i] = make([]byte, out.Bytes())
		require.NoError(t, bufs[len(g.Inputs)+i].Read(0, outs[i]))
	}
	return outs
}

func randF32(r *rand.Rand, n int) []byte {
	b := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(r.NormFloat64())))
	}
	return b
}

// TestNEONMatchesReference prepares and runs a small MLP block through the purego adapter on
// the NEON plugin (found as the loader finds it: XPU_PLUGIN_PATH or build/plugins from `make
// plugins`) and compares with core/ref.
func TestNEONMatchesReference(t *testing.T) {
	neon, err := Open(context.Background(), "neon")
	if errors.Is(err, core.ErrNotFound) {
		required.Skip(t, "neon", "no usable NEON plugin (run `make plugins`): %v", err)
	}
	require.NoError(t, err)
	defer neon.Close()
	ref, err := Open(context.Background(), RefName)
	require.NoError(t, err)
	defer ref.Close()

	r := rand.New(rand.NewSource(7))
	g := core.NewGraph()
	x := g.Input("x", core.F32, 3, 8)
	w := g.Const("w", core.F32, core.Shape{16, 8}, randF32(r, 16*8))
	bias := g.Const("bias", core.F32, core.Shape{16}, randF32(r, 16))
	h := g.SiLU(g.RMSNorm(g.Add(g.MatMul(x, w), bias), 1e-5))
	g.Output(g.Softmax(h, 1))
	require.NoError(t, g.Err())
	in := [][]byte{randF32(r, 3*8)}

	got := runGraph(t, neon, g, in)[0]
	want := runGraph(t, ref, g, in)[0]
	var maxErr float64
	for i := 0; i < len(got); i += 4 {
		a := math.Float32frombits(binary.LittleEndian.Uint32(got[i:]))
		b := math.Float32frombits(binary.LittleEndian.Uint32(want[i:]))
		maxErr = math.Max(maxErr, math.Abs(float64(a-b)))
	}
	t.Logf("neon vs ref: max abs error %.3g over %d values", maxErr, len(got)/4)
	require.Less(t, maxErr, 1e-4)
}
