package shard

import (
	"fmt"
	"math"
	"slices"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// Cut is a sharded decode's cut of every layer: per shard its KV heads [KV0, KV0+NKV)
// (with their query heads) and its FFN neurons, as pieces [from, from+count) in neuron order
// (one per shard, or with adaptive shards the fixed part and the movable pieces it holds).
type Cut struct {
	Units    []int // plan unit per shard
	KV0, NKV []int64
	FFN      [][][2]int64
	// Shared, with stealing shards, are the FFN's pieces instead of FFN: either of the two
	// units runs each (StageSpec.Shared), each taking them from its end.
	Shared [][2]int64
}

// Adaptive shards (PlanShards.Adapt) move FFN neurons between the two units from token to
// token: AdaptSteps pieces of AdaptStep of the neurons on each side of the plan's cut can go
// either way, so there are 2·AdaptSteps+1 cuts, each a decode program of its own.
const (
	// AdaptSteps is how many movable pieces each side of the plan's cut has.
	AdaptSteps = 2
	// AdaptStep is the share of the neurons in one movable piece.
	AdaptStep = 0.03
)

// Dims are the model sizes a cut divides, and the weight dtypes of the two projections whose
// columns the shards split (their quantization blocks must stay whole; zero: not known, no
// blocks).
type Dims struct {
	KVHeads, Heads, HeadDim, FFN int64
	AttnOutput, FFNDown          core.DType
}

// Cuts cuts a model's layers by the plan's shares: KV heads whole, neurons in whole blocks of
// the down projection's quantization (and of 32, a SIMD tile of gate and up rows). It returns
// one cut, or with adaptive shards every cut, unit 0's neurons rising.
func Cuts(ps *sched.PlanShards, cfg Dims) ([]*Cut, error) {
	if ps == nil || len(ps.Units) == 0 || len(ps.Ratio) != len(ps.Units) || cfg.KVHeads <= 0 || cfg.Heads%max(cfg.KVHeads, 1) != 0 || cfg.FFN <= 0 {
		return nil, fmt.Errorf("shard: decode shards over %v of %d KV heads (%d heads) and %d FFN neurons: %w",
			ps, cfg.KVHeads, cfg.Heads, cfg.FFN, core.ErrInvalidArgument)
	}
	align := max(int64(32), cfg.FFNDown.BlockLen())
	base := Cut{Units: ps.Units}
	heads, neurons := ps.Cut(cfg.KVHeads, 1), ps.Cut(cfg.FFN, align)
	var kv, f int64
	var bounds []int64 // where the shards' neurons start, and the end
	for s := range ps.Units {
		if heads[s] == 0 || neurons[s] == 0 {
			return nil, fmt.Errorf("shard: decode shards %v: shard %d gets %d of %d KV heads and %d of %d FFN neurons: %w",
				ps.Ratio, s, heads[s], cfg.KVHeads, neurons[s], cfg.FFN, core.ErrInvalidArgument)
		}
		base.KV0, base.NKV = append(base.KV0, kv), append(base.NKV, heads[s])
		bounds = append(bounds, f)
		kv, f = kv+heads[s], f+neurons[s]
	}
	bounds = append(bounds, f)
	var cuts []*Cut
	switch {
	case ps.Steal:
		// pieces from each end: a side's share by the fractions, the last piece what is left
		c := base
		mid := bounds[1]
		edges := []int64{0, f} // where pieces meet, from unit 0's end and from unit 1's
		var cum float64
		for _, fr := range ps.StealFractions() {
			cum += fr
			edges = append(edges, min(int64(math.Round(float64(mid)*cum/float64(align)))*align, mid),
				max(f-int64(math.Round(float64(f-mid)*cum/float64(align)))*align, mid))
		}
		slices.Sort(edges)
		edges = slices.Compact(edges)
		for i := 0; i+1 < len(edges); i++ {
			c.Shared = append(c.Shared, [2]int64{edges[i], edges[i+1] - edges[i]})
		}
		if len(c.Shared) < 2 {
			return nil, fmt.Errorf("shard: stealing decode shards: %d FFN neurons make %d piece: %w", cfg.FFN, len(c.Shared),
				core.ErrInvalidArgument)
		}
		c.FFN = [][][2]int64{c.Shared[:1], c.Shared[len(c.Shared)-1:]} // for the checks below: where each side starts
		cuts = append(cuts, &c)
	case !ps.Adapt:
		c := base
		for s := range ps.Units {
			c.FFN = append(c.FFN, [][2]int64{{bounds[s], bounds[s+1] - bounds[s]}})
		}
		cuts = append(cuts, &c)
	default:
		// pieces: unit 0's fixed neurons, the movable ones, unit 1's fixed neurons
		step := int64(math.Round(float64(cfg.FFN)*AdaptStep/float64(align))) * align
		mid := bounds[1]
		lo, hi := mid-AdaptSteps*step, mid+AdaptSteps*step
		if len(ps.Units) != 2 || step == 0 || lo <= 0 || hi >= f {
			return nil, fmt.Errorf("shard: adaptive decode shards %v: %d FFN neurons leave no room to move %d pieces of %d on each side of neuron %d: %w",
				ps.Ratio, cfg.FFN, AdaptSteps, step, mid, core.ErrInvalidArgument)
		}
		edges := []int64{0}
		for e := lo; e <= hi; e += step {
			edges = append(edges, e)
		}
		edges = append(edges, f)
		for v := 1; v < len(edges)-1; v++ {
			c := base
			c.FFN = make([][][2]int64, 2)
			for i := 0; i+1 < len(edges); i++ {
				s := 0
				if i >= v {
					s = 1
				}
				c.FFN[s] = append(c.FFN[s], [2]int64{edges[i], edges[i+1] - edges[i]})
			}
			cuts = append(cuts, &c)
		}
	}
	// each shard's columns of the two projections must be whole quantization blocks
	group, D := cfg.Heads/cfg.KVHeads, cfg.HeadDim
	for _, c := range cuts {
		for s := range c.Units {
			for _, p := range []struct {
				name string
				k0   int64
				dt   core.DType
			}{{"attn_output", c.KV0[s] * group * D, cfg.AttnOutput}, {"ffn_down", c.FFN[s][0][0], cfg.FFNDown}} {
				if p.k0%p.dt.BlockLen() != 0 {
					return nil, fmt.Errorf("shard: decode shards %v: a shard's %s columns from %d are not whole %s blocks: %w",
						ps.Ratio, p.name, p.k0, p.dt, core.ErrUnsupported)
				}
			}
		}
	}
	return cuts, nil
}

// Neurons counts the neurons of pieces.
func Neurons(pieces [][2]int64) int64 {
	var n int64
	for _, p := range pieces {
		n += p[1]
	}
	return n
}
