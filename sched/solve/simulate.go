package solve

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched/dag"
	"github.com/xpuhub/xpu/sched/profile"
)

// seconds converts profile seconds to a duration.
func seconds(v float64) time.Duration { return time.Duration(math.Round(v * 1e9)) }

// Replay replays the plan's prefill under another dispatch policy (in-order against
// out-of-order) with the same costs.
func Replay(prof *profile.Profile, plan *Plan, pol dag.Policy) (*dag.Result, error) {
	s := &solver{p: prof, o: Options{Prompt: plan.Prompt, Context: plan.Context, Policy: pol}, units: plan.Used, memo: map[memoKey]cost{}}
	s.layer, s.head = layerOps(prof.Model)
	c := candidate{label: plan.Prefill.Candidate, stages: slices.Clone(plan.Prefill.LayerUnits)}
	if c.stages != nil && len(c.stages) != prof.Model.Layers {
		return nil, fmt.Errorf("solve: replay: a layer split of %d layers for a %d-layer model: %w", len(c.stages), prof.Model.Layers, core.ErrInvalidArgument)
	}
	for _, u := range c.stages {
		if u < 0 || u >= len(prof.Units) {
			return nil, fmt.Errorf("solve: replay: layer split on unit %d of %d: %w", u, len(prof.Units), core.ErrInvalidArgument)
		}
	}
	for _, op := range plan.Prefill.Layer {
		c.layer = append(c.layer, op.Choice)
	}
	for _, op := range plan.Prefill.Head {
		c.head = append(c.head, op.Choice)
	}
	if len(c.layer) != len(s.layer) || len(c.head) != len(s.head) || plan.Prefill.Rows < 1 || plan.Prefill.Chunks < 1 {
		return nil, fmt.Errorf("solve: replay: the plan does not fit the profile's model: %w", core.ErrInvalidArgument)
	}
	for _, ch := range append(append([]Choice{}, c.layer...), c.head...) {
		ok := len(ch.Units) > 0 && (ch.Strategy == StrategySingle || len(ch.Units) == 2)
		for _, u := range ch.Units {
			ok = ok && u >= 0 && u < len(prof.Units)
		}
		switch ch.Strategy {
		case StrategySingle, StrategyMultiSeq:
		case StrategyRows, StrategySeq, StrategyHybrid:
			ok = ok && len(ch.Ratio) == len(ch.Units)
		default:
			ok = false
		}
		if !ok {
			return nil, fmt.Errorf("solve: replay: choice %+v does not fit the profile's %d units: %w", ch, len(prof.Units), core.ErrInvalidArgument)
		}
	}
	d, err := s.build("prefill", c, plan.Prefill.Rows, plan.Prefill.Chunks)
	if err != nil {
		return nil, err
	}
	return simulate(prof, d, pol)
}

// simulate replays d under pol with the profile's costs. A measured profile's plan runs on
// sched's runtime, which fixes each unit's task order before a request by its own dispatch
// simulation, and for a first prefill (`xpu run`'s) knows no partition's cost yet: the replay
// takes that order (runtimeOrder) and runs it at the real costs. (The out-of-order rule with
// the real costs interleaves the two lanes' chunks on the first unit of a layer split and
// starts the second late; the runtime, ordering at uniform costs, does not, so that replay
// predicted a layer split slower than one unit where the runtime ran it faster:
// the lab notes on the profiler and solver.) A simulated
// profile's plan is replayed under pol itself.
func simulate(p *profile.Profile, d *dag.DAG, pol dag.Policy) (*dag.Result, error) {
	if p.Simulated() {
		return dag.Simulate(d, pol, simOptions(p)...)
	}
	order, err := runtimeOrder(d, pol)
	if err != nil {
		return nil, err
	}
	res, err := dag.Simulate(d, newFixedOrder(order), simOptions(p)...)
	if err != nil {
		return nil, err
	}
	res.Policy = pol.Name()
	return res, nil
}

// simOptions are the replay's options for a profile: its sync costs and, where units slow each
// other down (units sharing this machine's cores), their shared slowdown.
func simOptions(p *profile.Profile) []dag.SimOption {
	opts := []dag.SimOption{dag.WithSync(p.SyncCost)}
	if p.Shared() {
		opts = append(opts, dag.WithSlowdown(p.Slowdown))
	}
	return opts
}
