package sched_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// randomGraph builds a random DAG of ADD, MUL, SCALE and SILU over [4] tensors with up to
// three inputs and two outputs.
func randomGraph(rng *rand.Rand) *core.Graph {
	g := core.NewGraph()
	vals := []*core.Tensor{}
	for i := range 1 + rng.IntN(3) {
		vals = append(vals, g.Input(string(rune('a'+i)), core.F32, 4))
	}
	vals = append(vals, g.Const("c", core.F32, core.Shape{4}, core.EncodeF32([]float32{0.5, -1, 2, 0.25})))
	pick := func() *core.Tensor { return vals[rng.IntN(len(vals))] }
	n := 1 + rng.IntN(12)
	var made []*core.Tensor
	for range n {
		var t *core.Tensor
		switch rng.IntN(4) {
		case 0:
			t = g.Add(pick(), pick())
		case 1:
			t = g.Mul(pick(), pick())
		case 2:
			t = g.Scale(pick(), 0.5, 0.125)
		default:
			t = g.SiLU(pick())
		}
		vals = append(vals, t)
		made = append(made, t)
	}
	g.Output(made[len(made)-1])
	if len(made) > 1 && rng.IntN(2) == 0 {
		g.Output(made[rng.IntN(len(made)-1)])
	}
	return g
}

// FuzzSessionSplit places random graphs on devices that each accept a random subset of the ops
// (with a CPU that accepts all) and checks the result equals one device running everything.
func FuzzSessionSplit(f *testing.F) {
	for seed := range uint64(40) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, 99))
		g := randomGraph(rng)
		require.NoError(t, g.Err())
		subset := func() []core.Op {
			var ops []core.Op
			for _, o := range allFakeOps {
				if rng.IntN(2) == 0 {
					ops = append(ops, o)
				}
			}
			return ops
		}
		npu := newFake("qnn", core.DeviceNPU, subset()...)
		gpu := newFake("opencl", core.DeviceGPU, subset()...)
		cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
		one := newFake("neon", core.DeviceCPU, allFakeOps...)

		ctx := context.Background()
		whole, err := sched.NewSession(ctx, g, devs(one), quiet)
		require.NoError(t, err)
		defer whole.Close()
		split, err := sched.NewSession(ctx, g, devs(npu, gpu, cpu), quiet)
		require.NoError(t, err)
		defer split.Close()

		r := split.Report()
		for _, n := range r.Nodes {
			if n.Partition >= 0 {
				assert.Less(t, n.Partition, r.Partitions)
			}
		}
		inputs := make([][]byte, len(g.Inputs))
		for i := range inputs {
			inputs[i] = core.EncodeF32([]float32{rng.Float32(), -rng.Float32(), 1, float32(i)})
		}
		want, err := whole.Run(ctx, inputs)
		require.NoError(t, err)
		got, err := split.Run(ctx, inputs)
		require.NoError(t, err)
		require.Len(t, got, len(want))
		for i := range want {
			assert.Equal(t, core.DecodeF32(want[i]), core.DecodeF32(got[i]), "output %d\n%s", i, r)
		}
	})
}
