package coreml_test

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/conformance"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/plugins/coreml"
	"github.com/xpuhub/xpu/plugins/coreml/emu"
)

func open(t *testing.T) core.Backend {
	t.Helper()
	t.Setenv("XPU_CACHE_DIR", t.TempDir())
	b, err := coreml.New()
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	if !b.Devices()[0].Info().Caps.Has(core.CapEmulated) {
		t.Skip("real Core ML: these tests check the emulated runtime")
	}
	return b
}

// Levels 1-4 of the suite (ops, buffers, graphs) through the emulated runtime: nothing fails,
// and what Core ML cannot run is refused in analysis with a reason.
func TestConformance(t *testing.T) {
	b := open(t)
	rep, err := conformance.Run(context.Background(), b, conformance.WithLevels(1, 2, 3, 4))
	require.NoError(t, err)
	for _, c := range rep.Cases {
		switch c.Status {
		case conformance.StatusFail:
			t.Errorf("%s: %s %v", c.Name, c.Category, c.Errors)
		case conformance.StatusUnsupported:
			assert.NotEmpty(t, c.Reason, c.Name)
		}
	}
	assert.Zero(t, rep.Failed)
	assert.Greater(t, rep.Passed, 300)
	t.Log(rep.Summary())
}

func TestEmulatedRuntimeIsLabelled(t *testing.T) {
	b := open(t)
	in := b.Devices()[0].Info()
	assert.Contains(t, in.Name, coreml.EmulatedLabel)
	assert.Equal(t, "coreml (emulated runtime)", coreml.EmulatedLabel)
	assert.True(t, in.Caps.Has(core.CapEmulated|core.CapStaticShapes))
	assert.Contains(t, b.Info().SDKVersion, "emulated")
	score, why := coreml.Probe()
	assert.Zero(t, score)
	assert.Contains(t, why, "Apple")
}

func TestUnits(t *testing.T) {
	for _, u := range coreml.Units {
		b, err := coreml.New(coreml.WithUnits(u))
		require.NoError(t, err, u)
		assert.Contains(t, b.Devices()[0].Info().Name, "units "+u)
		b.Close()
	}
	_, err := coreml.New(coreml.WithUnits("tpu"))
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
}

func randf(r *rand.Rand, n int, s float32) []float32 {
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = (r.Float32()*2 - 1) * s
	}
	return xs
}

func prepare(t *testing.T, b core.Backend, g *core.Graph) (core.Context, core.Executable) {
	t.Helper()
	require.NoError(t, g.Err())
	cx, err := b.Devices()[0].NewContext(context.Background(), nil)
	require.NoError(t, err)
	ex, err := cx.Prepare(context.Background(), g)
	require.NoError(t, err)
	t.Cleanup(func() { ex.Close(); cx.Close() })
	return cx, ex
}

func run(t *testing.T, cx core.Context, ex core.Executable, g *core.Graph, inputs [][]byte) ([][]byte, error) {
	t.Helper()
	x, err := ex.NewExecution()
	require.NoError(t, err)
	defer x.Close()
	var outs []core.Buffer
	for i, in := range inputs {
		buf, err := cx.Alloc(int64(len(in)), core.BufferHostVisible)
		require.NoError(t, err)
		defer buf.Close()
		require.NoError(t, buf.Write(0, in))
		require.NoError(t, x.Bind(i, buf, 0))
	}
	for i, o := range g.Outputs {
		buf, err := cx.Alloc(o.Bytes(), core.BufferHostVisible)
		require.NoError(t, err)
		defer buf.Close()
		require.NoError(t, x.Bind(len(inputs)+i, buf, 0))
		outs = append(outs, buf)
	}
	if err := x.Run(context.Background()); err != nil {
		return nil, err
	}
	res := make([][]byte, len(outs))
	for i, buf := range outs {
		res[i] = make([]byte, buf.Size())
		require.NoError(t, buf.Read(0, res[i]))
	}
	return res, nil
}

// One weight used by two MATMULs is written to weight.bin once, and the package the lowering
// wrote parses in the emulator with the MIL ops the lowering chose.
func TestPackageLayoutAndSharedWeight(t *testing.T) {
	b := open(t)
	r := rand.New(rand.NewPCG(1, 2))
	g := core.NewGraph()
	x := g.Input("x", core.F32, 3, 64)
	w := g.Const("w", core.F32, core.Shape{64, 64}, core.EncodeF32(randf(r, 64*64, 0.1)))
	g.Output(g.MatMul(g.SiLU(g.MatMul(x, w)), w))
	_, ex := prepare(t, b, g)
	pkg, ok := coreml.Package(ex)
	require.True(t, ok)
	for _, f := range []string{"Manifest.json", "Data/com.apple.CoreML/model.mlmodel", "Data/com.apple.CoreML/weights/weight.bin"} {
		assert.FileExists(t, filepath.Join(pkg, f))
	}
	wb, err := os.ReadFile(filepath.Join(pkg, "Data/com.apple.CoreML/weights/weight.bin"))
	require.NoError(t, err)
	assert.Less(t, len(wb), 2*64*64*4, "the shared weight is stored once")
	assert.Equal(t, uint32(1), uint32(wb[0])|uint32(wb[1])<<8, "one blob")
	m, err := emu.Load(pkg)
	require.NoError(t, err)
	assert.Equal(t, 2, m.Ops["matmul"])
	assert.Equal(t, 1, m.Ops["silu"])
	assert.Equal(t, 7, m.SpecVersion)
	assert.Equal(t, "CoreML6", m.Opset)
}

// Preparing the same graph again reuses the package in the cache instead of writing it.
func TestCacheReuse(t *testing.T) {
	b := open(t)
	g := core.NewGraph()
	g.Output(g.ReLU(g.Input("x", core.F16, 4, 8)))
	_, ex1 := prepare(t, b, g)
	p1, _ := coreml.Package(ex1)
	st1, err := os.Stat(filepath.Join(p1, "Manifest.json"))
	require.NoError(t, err)
	_, ex2 := prepare(t, b, g)
	p2, _ := coreml.Package(ex2)
	assert.Equal(t, p1, p2)
	st2, err := os.Stat(filepath.Join(p2, "Manifest.json"))
	require.NoError(t, err)
	assert.Equal(t, st1.ModTime(), st2.ModTime())
}

// A KV cache whose unwritten tail holds NaN does not leak into the output: masked keys and
// values are replaced before any arithmetic.
func TestAttentionIgnoresGarbageTail(t *testing.T) {
	b := open(t)
	r := rand.New(rand.NewPCG(5, 6))
	const tq, tk, h, d = 2, 8, 2, 16
	g := core.NewGraph()
	q := g.Input("q", core.F32, tq, h, d)
	k := g.Input("k", core.F32, tk, h, d)
	v := g.Input("v", core.F32, tk, h, d)
	off := g.Input("off", core.I32, 1)
	g.Output(g.Attention(q, k, v, core.AttentionOptions{Causal: true, QOffsetInput: off}))
	require.NoError(t, g.Err())
	kv := func() []float32 {
		xs := randf(r, tk*h*d, 1)
		for i := 5 * h * d; i < len(xs); i++ { // rows 5.. are past the last visible key (3+1)
			xs[i] = float32(math.NaN())
		}
		return xs
	}
	inputs := [][]byte{core.EncodeF32(randf(r, tq*h*d, 1)), core.EncodeF32(kv()), core.EncodeF32(kv()), core.EncodeI32([]int32{3})}
	cx, ex := prepare(t, b, g)
	got, err := run(t, cx, ex, g, inputs)
	require.NoError(t, err)
	want, err := ref.Run(context.Background(), g, inputs)
	require.NoError(t, err)
	for i := 0; i < len(got[0]); i += 4 {
		gv := math.Float32frombits(uint32(got[0][i]) | uint32(got[0][i+1])<<8 | uint32(got[0][i+2])<<16 | uint32(got[0][i+3])<<24)
		wv := math.Float32frombits(uint32(want[0][i]) | uint32(want[0][i+1])<<8 | uint32(want[0][i+2])<<16 | uint32(want[0][i+3])<<24)
		require.False(t, math.IsNaN(float64(gv)), "element %d", i/4)
		assert.InDelta(t, wv, gv, 1e-5, "element %d", i/4)
	}
}
