package kvcache

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/sched"
)

// shiftRuntime is a one-unit runtime on the reference backend with two layers' F32 K caches of
// 8 rows, filled with random keys.
func shiftRuntime(t *testing.T, c *arch.Config) (*sched.Runtime, []sched.Span, []float32) {
	b := ref.New()
	t.Cleanup(func() { _ = b.Close() })
	rt, err := sched.NewRuntime(context.Background(), b.Devices(), []sched.UnitSpec{{Backend: b.Devices()[0].Info().Backend}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rt.Close() })
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]float32, 8*c.KVHeads*c.HeadDim)
	for i := range keys {
		keys[i] = rng.Float32()*2 - 1
	}
	var ks []sched.Span
	for range c.Layers {
		s, err := rt.Arena().Alloc(int64(4 * len(keys)))
		require.NoError(t, err)
		copy(rt.Arena().Bytes(s), core.EncodeF32(keys))
		ks = append(ks, s)
	}
	return rt, ks, keys
}

// A shift by n and one by -n give the keys back, and a node no rule places runs with its
// layer's rope.
func TestShifterRotates(t *testing.T) {
	c := &arch.Config{Layers: 2, KVHeads: 2, HeadDim: 32, RopeDims: 32, RopeBase: 10000, RopeFreqScale: 1}
	rt, ks, keys := shiftRuntime(t, c)
	ropes := 0
	place := func(n *core.Node) (int, int, error) {
		if strings.HasSuffix(n.Name, "k_rope") {
			ropes++
			return 0, -1, nil
		}
		return 0, 0, sched.ErrNoRule
	}
	sh, err := NewShifter(context.Background(), rt, ShifterSpec{Config: c, ContextLength: 8, Rows: 4, K: core.F32, KCache: ks, Place: place})
	require.NoError(t, err)
	defer sh.Close()
	assert.GreaterOrEqual(t, ropes, 2*c.Layers, "each layer's rope was placed, as the probe and as a node")
	layer := func(l int) []float32 { return core.DecodeF32(rt.Arena().Bytes(ks[l])) }

	require.NoError(t, sh.Rotate(context.Background(), 0, 6, 5))
	rows := 8 * c.KVHeads * c.HeadDim
	for l := range c.Layers {
		got := layer(l)
		assert.NotEqual(t, keys[:rows], got, "layer %d rotated", l)
	}
	require.NoError(t, sh.Rotate(context.Background(), 0, 6, -5))
	for l := range c.Layers {
		assert.InDeltaSlice(t, keys, layer(l), 1e-5, "layer %d back", l)
	}
}

// A spec that does not fit the model, or a unit the plan refuses, is an error.
func TestShifterBadSpec(t *testing.T) {
	c := &arch.Config{Layers: 2, KVHeads: 2, HeadDim: 32, RopeDims: 32, RopeBase: 10000, RopeFreqScale: 1}
	rt, ks, _ := shiftRuntime(t, c)
	ok := func(*core.Node) (int, int, error) { return 0, -1, nil }
	boom := errors.New("boom")
	for name, tc := range map[string]struct {
		spec ShifterSpec
		want error
	}{
		"one K cache for two layers": {ShifterSpec{Config: c, Rows: 4, K: core.F32, KCache: ks[:1], Place: ok}, core.ErrInvalidArgument},
		"no rows":                    {ShifterSpec{Config: c, Rows: 0, K: core.F32, KCache: ks, Place: ok}, core.ErrInvalidArgument},
		"no config":                  {ShifterSpec{Rows: 4, K: core.F32, KCache: ks, Place: ok}, core.ErrInvalidArgument},
		"no placement":               {ShifterSpec{Config: c, Rows: 4, K: core.F32, KCache: ks}, core.ErrInvalidArgument},
		"the plan fails": {ShifterSpec{Config: c, Rows: 4, K: core.F32, KCache: ks,
			Place: func(*core.Node) (int, int, error) { return 0, 0, boom }}, boom},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewShifter(context.Background(), rt, tc.spec)
			require.ErrorIs(t, err, tc.want)
		})
	}
}
