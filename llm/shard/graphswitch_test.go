package shard

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

func TestPlanGraphSwitch(t *testing.T) {
	ms := time.Millisecond
	uniform := func(n int, p, v, l time.Duration) []Block {
		out := make([]Block, n)
		for i := range out {
			out[i] = Block{Prefill: p, Verify: v, Load: l}
		}
		return out
	}
	t.Run("the paper's figure 8: one load hides behind two block computations", func(t *testing.T) {
		p, err := PlanSwitch(uniform(4, 2*ms, 3*ms, 4*ms), 2)
		require.NoError(t, err)
		assert.Equal(t, []Load{{0, 2 * ms, 6 * ms}, {1, 6 * ms, 10 * ms}, {2, 16 * ms, 20 * ms}, {3, 20 * ms, 24 * ms}}, p.Loads)
		assert.Equal(t, 18*ms, p.PrefillEnd, "two blocks ran their second chunk on the verify graph")
		assert.Equal(t, 24*ms, p.End)
		assert.Equal(t, 32*ms, p.Sync)
		assert.Equal(t, 26*ms, p.NaiveAsync)
	})
	t.Run("loads shorter than a block hide completely", func(t *testing.T) {
		p, err := PlanSwitch(uniform(6, 5*ms, 5*ms, ms), 3)
		require.NoError(t, err)
		require.Len(t, p.Loads, 6)
		assert.Equal(t, p.PrefillEnd, p.End, "every load ended during prefill")
		assert.Equal(t, 90*ms, p.PrefillEnd)
		assert.Less(t, p.End, p.NaiveAsync)
		assert.Less(t, p.NaiveAsync, p.Sync)
	})
	t.Run("loads never overlap and come in block order", func(t *testing.T) {
		blocks := []Block{{3 * ms, 4 * ms, 7 * ms}, {ms, 2 * ms, 2 * ms}, {5 * ms, 5 * ms, 9 * ms}, {2 * ms, 3 * ms, ms}}
		for chunks := 1; chunks <= 5; chunks++ {
			p, err := PlanSwitch(blocks, chunks)
			require.NoError(t, err)
			require.Len(t, p.Loads, len(blocks))
			for i, l := range p.Loads {
				assert.Equal(t, i, l.Block)
				assert.Equal(t, blocks[i].Load, l.End-l.Start)
				if i > 0 {
					assert.GreaterOrEqual(t, l.Start, p.Loads[i-1].End)
				}
			}
			assert.LessOrEqual(t, p.End, p.Sync)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		_, err := PlanSwitch(nil, 2)
		require.ErrorIs(t, err, core.ErrInvalidArgument)
		_, err = PlanSwitch(uniform(2, ms, ms, ms), 0)
		require.ErrorIs(t, err, core.ErrInvalidArgument)
		_, err = PlanSwitch([]Block{{Load: -ms}}, 1)
		require.ErrorIs(t, err, core.ErrInvalidArgument)
	})
}
