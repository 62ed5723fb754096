package sched_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/sched"
)

// pickyDevice is the reference device presented as another device that accepts only some ops:
// it stands in for an NPU that runs matmuls and nothing else, with real arithmetic.
type pickyDevice struct {
	core.Device
	backend string
	kind    core.DeviceKind
	accepts map[core.Op]bool
}

func (d *pickyDevice) Info() core.DeviceInfo {
	info := d.Device.Info()
	info.Backend, info.Kind, info.Caps = d.backend, d.kind, info.Caps&^core.CapConcurrent
	return info
}

func (d *pickyDevice) NewContext(ctx context.Context, options map[string]string) (core.Context, error) {
	c, err := d.Device.NewContext(ctx, options)
	if err != nil {
		return nil, err
	}
	return &pickyContext{Context: c, dev: d}, nil
}

type pickyContext struct {
	core.Context
	dev *pickyDevice
}

func (c *pickyContext) Device() core.Device { return c.dev }

func (c *pickyContext) Analyze(ctx context.Context, g *core.Graph) ([]core.NodeVerdict, error) {
	vs, err := c.Context.Analyze(ctx, g)
	if err != nil {
		return nil, err
	}
	for i, n := range g.Nodes {
		if !c.dev.accepts[n.Op] {
			vs[i] = core.NodeVerdict{Reason: fmt.Sprintf("%s not offloaded", n.Op)}
		} else if vs[i].Supported {
			vs[i].Precision = core.PrecF16 // what an NPU would report
		}
	}
	return vs, nil
}

func (c *pickyContext) Prepare(ctx context.Context, g *core.Graph, opts ...core.PrepareOption) (core.Executable, error) {
	for _, n := range g.Nodes {
		if !c.dev.accepts[n.Op] {
			return nil, fmt.Errorf("picky: %s: %w", n, core.ErrUnsupported)
		}
	}
	return c.Context.Prepare(ctx, g, opts...)
}

func randConst(g *core.Graph, rng *rand.Rand, name string, shape ...int64) *core.Tensor {
	v := make([]float32, core.Shape(shape).NumElements())
	for i := range v {
		v[i] = float32(rng.NormFloat64()) * 0.2
	}
	return g.Const(name, core.F32, shape, core.EncodeF32(v))
}

// block is a small transformer block: RMSNorm, QKV matmuls, RoPE, causal GQA attention, output
// projection and residual, then a SwiGLU FFN and residual.
func block(t testing.TB) *core.Graph {
	const T, D, H, KV, HD, FF = 5, 32, 4, 2, 8, 48
	rng := rand.New(rand.NewPCG(1, 2))
	g := core.NewGraph()
	x := g.Input("x", core.F32, T, D)
	pos := g.Input("pos", core.I32, T)
	h := g.RMSNorm(x, 1e-5)
	q := g.Reshape(g.MatMul(h, randConst(g, rng, "wq", H*HD, D)), T, H, HD)
	k := g.Reshape(g.MatMul(h, randConst(g, rng, "wk", KV*HD, D)), T, KV, HD)
	v := g.Reshape(g.MatMul(h, randConst(g, rng, "wv", KV*HD, D)), T, KV, HD)
	q = g.RoPE(q, pos, core.RoPEOptions{})
	k = g.RoPE(k, pos, core.RoPEOptions{})
	a := g.Reshape(g.Attention(q, k, v, core.AttentionOptions{Causal: true}), T, H*HD)
	x = g.Add(x, g.MatMul(a, randConst(g, rng, "wo", D, H*HD)))
	h = g.RMSNorm(x, 1e-5)
	gate := g.SiLU(g.MatMul(h, randConst(g, rng, "wg", FF, D)))
	up := g.MatMul(h, randConst(g, rng, "wu", FF, D))
	g.Output(g.Add(x, g.MatMul(g.Mul(gate, up), randConst(g, rng, "wd", D, FF))))
	require.NoError(t, g.Err())
	return g
}

func blockInputs(seed uint64) [][]byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	x := make([]float32, 5*32)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return [][]byte{core.EncodeF32(x), core.EncodeI32([]int32{3, 4, 5, 6, 7})}
}

// TestSplitMatchesWhole runs a transformer block with its matmuls on a matmul-only device and
// everything else on the reference, and compares with the reference alone.
func TestSplitMatchesWhole(t *testing.T) {
	ctx := context.Background()
	refB := ref.New()
	defer refB.Close()
	refDev := refB.Devices()[0]
	npu := &pickyDevice{Device: refDev, backend: "npu-sim", kind: core.DeviceNPU,
		accepts: map[core.Op]bool{core.OpMatMul: true}}
	g := block(t)

	whole, err := sched.NewSession(ctx, g, []core.Device{refDev}, quiet)
	require.NoError(t, err)
	defer whole.Close()
	split, err := sched.NewSession(ctx, g, []core.Device{npu, refDev}, sched.WithPolicy(sched.PreferNPU), quiet)
	require.NoError(t, err)
	defer split.Close()

	r := split.Report()
	assert.Equal(t, []string{"npu-sim:0", "ref:0"}, r.Units)
	// rms | q,k,v | reshape..attention | o | add,rms | gate,up | silu,mul | down | add
	assert.Equal(t, 9, r.Partitions)
	// to the npu: h, attention, h2, gate*up; back: q, k, v, o, gate, up, down
	assert.Equal(t, 11, r.CopiesPerRun)
	for _, n := range r.Nodes {
		if n.Op == core.OpMatMul {
			assert.Equal(t, "npu-sim:0", n.Unit, n.Node)
			// the executable's verdicts (the precision actually used) win over Analyze's
			assert.Equal(t, core.PrecF32, n.Precision, n.Node)
		} else {
			assert.Equal(t, "ref:0", n.Unit, n.Node)
			assert.True(t, n.Fallback, n.Node)
		}
	}
	t.Log("\n" + r.String())

	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 3 {
				in := blockInputs(uint64(w*10 + i))
				want, err := whole.Run(ctx, in)
				if !assert.NoError(t, err) {
					return
				}
				got, err := split.Run(ctx, in)
				if !assert.NoError(t, err) {
					return
				}
				assert.InDeltaSlice(t, core.DecodeF32(want[0]), core.DecodeF32(got[0]), 1e-5)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(12), split.Report().Runs)
}

func TestStrictOnRef(t *testing.T) {
	refB := ref.New()
	defer refB.Close()
	npu := &pickyDevice{Device: refB.Devices()[0], backend: "npu-sim", kind: core.DeviceNPU,
		accepts: map[core.Op]bool{core.OpMatMul: true}}
	_, err := sched.NewSession(context.Background(), block(t), []core.Device{npu, refB.Devices()[0]},
		sched.WithPolicy(sched.PreferNPU), sched.Strict(), quiet)
	require.ErrorIs(t, err, core.ErrUnsupported)
	assert.Contains(t, err.Error(), "RMS_NORM")
	assert.Contains(t, err.Error(), "npu-sim:0: RMS_NORM not offloaded")
}
