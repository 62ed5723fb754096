package kvcache

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/arch"
)

func TestParseType(t *testing.T) {
	for _, s := range []string{"q5_1", "i8", "q4_k", ""} {
		_, err := ParseType(s)
		assert.ErrorIs(t, err, core.ErrInvalidArgument, "%q", s)
	}
	for s, want := range map[string]core.DType{"f32": core.F32, "F16": core.F16, "q8_0": core.Q8_0, "Q4_0": core.Q4_0} {
		dt, err := ParseType(s)
		require.NoError(t, err)
		assert.Equal(t, want, dt)
	}
}

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		headDim int
		t       Types
		ok      bool
	}{
		{8, Types{K: core.F16, V: core.F32}, true},
		{32, Types{K: core.Q8_0, V: core.Q4_0}, true},
		{8, Types{K: core.Q8_0, V: core.F16}, false}, // a head narrower than a block
		{64, Types{K: core.F16, V: core.I8}, false},
	} {
		err := Check(c.headDim, c.t)
		if c.ok {
			assert.NoError(t, err, "%d %s", c.headDim, c.t)
		} else {
			assert.ErrorIs(t, err, core.ErrInvalidArgument, "%d %s", c.headDim, c.t)
		}
	}
}

func TestSizes(t *testing.T) {
	c := arch.Config{Layers: 3, KVHeads: 2, HeadDim: 32}
	k, v := Types{K: core.F16, V: core.Q8_0}.RowBytes(c)
	assert.Equal(t, int64(64*2), k, "f16: 2 bytes per value")
	assert.Equal(t, int64(2*34), v, "q8_0: a 34-byte block per 32 values")
	assert.Equal(t, int64(3*10*256), Bytes(c, 10, core.F32))
	assert.Equal(t, "f16", Types{K: core.F16, V: core.F16}.String())
	assert.Equal(t, "k f16, v q8_0", Types{K: core.F16, V: core.Q8_0}.String())
}

// TestShiftGraph: the rotation reads and writes every layer's K rows in the cache's dtype, with
// positions for the ROPE op or cos/sin tables for a model with per-frequency factors.
func TestShiftGraph(t *testing.T) {
	base := arch.Config{Layers: 2, KVHeads: 2, HeadDim: 32, RopeDims: 32, RopeBase: 10000, RopeFreqScale: 1}
	tables := base
	tables.RopeFreqFactors = make([]float32, 16)
	for _, c := range []struct {
		name   string
		cfg    arch.Config
		kt     core.DType
		inputs []string
	}{
		{"rope f16", base, core.F16, []string{"pos", "blk.0.k_cache", "blk.1.k_cache"}},
		{"tables q8_0", tables, core.Q8_0, []string{"rope_cos", "rope_sin", "blk.0.k_cache", "blk.1.k_cache"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, err := ShiftGraph(&c.cfg, 4, c.kt)
			require.NoError(t, err)
			var names []string
			for _, in := range g.Inputs {
				names = append(names, in.Name)
			}
			assert.Equal(t, c.inputs, names)
			require.Len(t, g.Outputs, c.cfg.Layers)
			for _, o := range g.Outputs {
				assert.Equal(t, c.kt, o.DType)
				assert.Equal(t, core.Shape{4, 2, 32}, o.Shape)
			}
		})
	}
}
