package shard

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

func TestCuts(t *testing.T) {
	dims := Dims{KVHeads: 4, Heads: 8, HeadDim: 16, FFN: 256}
	half := []float64{0.5, 0.5}
	t.Run("equal shares split heads and neurons in two", func(t *testing.T) {
		cuts, err := Cuts(&sched.PlanShards{Units: []int{0, 1}, Ratio: half}, dims)
		require.NoError(t, err)
		require.Len(t, cuts, 1)
		c := cuts[0]
		assert.Equal(t, []int64{0, 2}, c.KV0)
		assert.Equal(t, []int64{2, 2}, c.NKV)
		assert.Equal(t, [][][2]int64{{{0, 128}}, {{128, 128}}}, c.FFN)
		assert.Nil(t, c.Shared)
	})
	t.Run("adaptive shards give every cut, unit 0's neurons rising", func(t *testing.T) {
		cuts, err := Cuts(&sched.PlanShards{Units: []int{0, 1}, Ratio: half, Adapt: true}, Dims{KVHeads: 4, Heads: 8, HeadDim: 16, FFN: 4096})
		require.NoError(t, err)
		require.Len(t, cuts, 2*AdaptSteps+1)
		for i, c := range cuts {
			assert.Equal(t, int64(4096), Neurons(c.FFN[0])+Neurons(c.FFN[1]))
			if i > 0 {
				assert.Greater(t, Neurons(c.FFN[0]), Neurons(cuts[i-1].FFN[0]))
			}
		}
	})
	t.Run("stealing shards cut the FFN into shared pieces", func(t *testing.T) {
		cuts, err := Cuts(&sched.PlanShards{Units: []int{0, 1}, Ratio: half, Steal: true}, Dims{KVHeads: 4, Heads: 8, HeadDim: 16, FFN: 4096})
		require.NoError(t, err)
		require.Len(t, cuts, 1)
		require.Greater(t, len(cuts[0].Shared), 2)
		var n int64
		for _, p := range cuts[0].Shared {
			n += p[1]
		}
		assert.Equal(t, int64(4096), n)
	})
	for _, c := range []struct {
		name string
		ps   *sched.PlanShards
		dims Dims
		want error
	}{
		{"no plan", nil, dims, core.ErrInvalidArgument},
		{"a ratio per unit missing", &sched.PlanShards{Units: []int{0, 1}, Ratio: []float64{1}}, dims, core.ErrInvalidArgument},
		{"no KV heads", &sched.PlanShards{Units: []int{0, 1}, Ratio: half}, Dims{Heads: 8, HeadDim: 16, FFN: 256}, core.ErrInvalidArgument},
		{"one KV head for two shards", &sched.PlanShards{Units: []int{0, 1}, Ratio: half}, Dims{KVHeads: 1, Heads: 2, HeadDim: 16, FFN: 256},
			core.ErrInvalidArgument},
		{"attn_output columns cut inside a block", &sched.PlanShards{Units: []int{0, 1}, Ratio: half},
			Dims{KVHeads: 4, Heads: 4, HeadDim: 8, FFN: 256, AttnOutput: core.Q4_0}, core.ErrUnsupported},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Cuts(c.ps, c.dims)
			require.ErrorIs(t, err, c.want)
		})
	}
}
