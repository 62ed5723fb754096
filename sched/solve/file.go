package solve

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/xpuhub/xpu/sched"
	"github.com/xpuhub/xpu/sched/dag"
	"github.com/xpuhub/xpu/sched/profile"
)

// File is the plan as the runtime reads it: per phase, a rule per named op of a layer (a split
// rule for a split MATMUL), the logits, then one rule without filters that places the rest (the
// norms and their weight multiply, the embedding lookup, reshapes and casts) on the norms' unit.
// A sharded decode's ops are its shards (sched.Shards, stealing or adaptive as Options.Steal
// and Options.Adapt say) instead of rules.
// Its units are the units the plan uses, in the profile's order. sched.ParsePlan reads its JSON.
func (p *Plan) File() *sched.Plan {
	used := map[int]bool{}
	for _, ph := range []Phase{p.Prefill, p.Decode} {
		for _, u := range ph.LayerUnits {
			used[u] = true
		}
		for _, op := range append(append([]OpPlan{}, ph.Layer...), ph.Head...) {
			for _, u := range op.Choice.Units {
				used[u] = true
			}
		}
	}
	f := &sched.Plan{}
	for i, n := range p.Units {
		if used[i] {
			f.Units = append(f.Units, n)
		}
	}
	phase := func(ph Phase) sched.PhasePlan {
		var fp sched.PhasePlan
		if ph.Name == "prefill" {
			fp.Chunk = ph.Rows
		}
		if ph.LayerUnits != nil {
			// contiguous ranges; the embedding counts as layer 0 and the head as the last
			for lo := 0; lo < len(ph.LayerUnits); {
				hi := lo
				for hi+1 < len(ph.LayerUnits) && ph.LayerUnits[hi+1] == ph.LayerUnits[lo] {
					hi++
				}
				r := sched.Rule{Unit: p.Units[ph.LayerUnits[lo]], Layers: fmt.Sprintf("%d-%d", lo, hi)}
				if hi == len(ph.LayerUnits)-1 {
					r.Layers = fmt.Sprintf("%d-", lo)
				}
				fp.Rules = append(fp.Rules, r)
				lo = hi + 1
			}
			return fp
		}
		rest := ""
		for _, op := range append(append([]OpPlan{}, ph.Layer...), ph.Head...) {
			c := op.Choice
			if op.Class == profile.OpNorm {
				rest = p.Units[c.Units[0]]
				continue
			}
			if c.Strategy == StrategyShard {
				// every sharded op has the same units and ratio: the shards take them all
				if fp.Shards == nil {
					fp.Shards = &sched.Shards{Ratio: c.Ratio, Steal: p.steals(c), Adapt: p.adapts(c)}
					for _, u := range c.Units {
						fp.Shards.Units = append(fp.Shards.Units, p.Units[u])
					}
				}
				continue
			}
			r := sched.Rule{Unit: p.Units[c.Units[0]], Nodes: op.Nodes}
			if c.Strategy != StrategySingle {
				sp := &sched.Split{Strategy: sched.SplitStrategy(c.Strategy), Ratio: c.Ratio}
				for _, u := range c.Units {
					sp.Units = append(sp.Units, p.Units[u])
				}
				for _, l := range c.Lengths {
					sp.Lengths = append(sp.Lengths, int64(l))
				}
				if c.Strategy == StrategyMultiSeq {
					sp.Ratio = nil
				}
				sp.Steal, sp.Adapt = p.steals(c), p.adapts(c)
				r.Split = sp
			}
			fp.Rules = append(fp.Rules, r)
		}
		fp.Rules = append(fp.Rules, sched.Rule{Unit: rest})
		return fp
	}
	f.Prefill, f.Decode = phase(p.Prefill), phase(p.Decode)
	return f
}

// Describe is the placement of op as one line: "npu", "rows npu 75% + gpu 25%",
// "multiseq npu [512 32] + gpu rest"; ", stealing" ends a split the plan file writes as a
// stealing one, ", adaptive" one it writes as an adaptive one.
func (p *Plan) Describe(c Choice) string {
	names := make([]string, len(c.Units))
	for i, u := range c.Units {
		names[i] = p.Units[u]
	}
	switch c.Strategy {
	case StrategySingle:
		return names[0]
	case StrategyMultiSeq:
		return fmt.Sprintf("multiseq %s %v + %s rest", names[0], c.Lengths, names[1])
	case StrategyHybrid:
		return fmt.Sprintf("hybrid %s %v×%.0f%% + %s the rest", names[0], c.Lengths, 100*c.Ratio[0], names[1])
	}
	parts := make([]string, len(names))
	for i := range names {
		parts[i] = fmt.Sprintf("%s %.0f%%", names[i], 100*c.Ratio[i])
	}
	d := c.Strategy + " " + strings.Join(parts, " + ")
	if p.steals(c) {
		d += ", stealing"
	}
	if p.adapts(c) {
		d += ", adaptive"
	}
	return d
}

// steals says whether the plan file writes c as a stealing split (Options.Steal).
func (p *Plan) steals(c Choice) bool {
	return p.Steal && (c.Strategy == StrategyRows || c.Strategy == StrategyShard) && len(c.Units) == 2
}

// adapts says whether the plan file writes c as an adaptive split (Options.Adapt).
func (p *Plan) adapts(c Choice) bool {
	return p.Adapt && !p.Steal && (c.Strategy == StrategyRows || c.Strategy == StrategyShard) && len(c.Units) == 2
}

// Row is one line of a comparison: a configuration's predicted prefill and decode.
type Row struct {
	Config  string
	Prefill Phase
	Decode  Phase
	// Bubble is the prefill bubble rate under the row's policy.
	Bubble float64
	Policy string
	// Makespan is the prefill time under the row's policy.
	Makespan time.Duration
	// Infeasible says why the configuration cannot run (a unit refuses an op); the row has no
	// figures then.
	Infeasible string
}

// PrefillTokPerSec is the row's prefill throughput under its policy.
func (r Row) PrefillTokPerSec(prompt int) float64 {
	if r.Makespan <= 0 {
		return 0
	}
	return float64(prompt) / r.Makespan.Seconds()
}

// Compare solves the configurations a comparison needs over o.Units: each unit alone, the
// layer-level plan and the tensor-level plan, then replays the layer- and tensor-level
// prefills in order (chunks in order on every unit) against the out-of-order policy. Every
// figure is predicted from prof.
func Compare(prof *profile.Profile, o Options) ([]Row, *Plan, error) {
	var rows []Row
	units := o.Units
	if units == nil {
		for _, u := range prof.Units {
			units = append(units, u.Name)
		}
	}
	add := func(label string, opts Options) (*Plan, error) {
		pl, err := Solve(prof, opts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", label, err)
		}
		rows = append(rows, Row{Config: label, Prefill: pl.Prefill, Decode: pl.Decode, Bubble: pl.Prefill.Sim.Bubble,
			Policy: pl.Policy, Makespan: pl.Prefill.Time})
		return pl, nil
	}
	for _, u := range units {
		opts := o
		opts.Units, opts.Mode = []string{u}, Single
		if _, err := add(u+"-only", opts); errors.Is(err, ErrNoPlan) {
			rows = append(rows, Row{Config: u + "-only", Infeasible: err.Error()})
		} else if err != nil {
			return nil, nil, err
		}
	}
	if len(units) < 2 {
		pl, err := Solve(prof, o)
		return rows, pl, err
	}
	var best *Plan
	for _, m := range []Mode{LayerSplit, Layer, Tensor} {
		opts := o
		opts.Units, opts.Mode = units, m
		pl, err := add(m.String(), opts)
		if err != nil {
			return nil, nil, err
		}
		in, err := Replay(prof, pl, dag.InOrder)
		if err != nil {
			return nil, nil, err
		}
		rows = append(rows, Row{Config: m.String() + ", chunks in order", Prefill: pl.Prefill, Decode: pl.Decode,
			Bubble: in.Bubble, Policy: dag.InOrder.Name(), Makespan: in.Makespan})
		if m == o.Mode || (best == nil && m != LayerSplit) {
			best = pl
		}
	}
	return rows, best, nil
}
