package solve

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/xpuhub/xpu/sched/dag"
	"github.com/xpuhub/xpu/sched/profile"
)

// PlanFile is the plan in the runtime's format (sched/PLAN.md: units, per phase a chunk length
// and rules, a rule's split). The solver writes it with its own types so that it does not
// depend on the runtime package's parser; the fields and their meaning are the runtime's.
type PlanFile struct {
	Units   []string  `json:"units"`
	Prefill FilePhase `json:"prefill"`
	Decode  FilePhase `json:"decode"`
}

// FilePhase is one phase of a PlanFile.
type FilePhase struct {
	Chunk int        `json:"chunk,omitempty"`
	Rules []FileRule `json:"rules"`
}

// FileRule places the nodes it matches.
type FileRule struct {
	Unit  string     `json:"unit"`
	Nodes []string   `json:"nodes,omitempty"`
	Split *FileSplit `json:"split,omitempty"`
}

// FileSplit cuts a MATMUL across units.
type FileSplit struct {
	Strategy string    `json:"strategy"`
	Units    []string  `json:"units"`
	Ratio    []float64 `json:"ratio,omitempty"`
	Lengths  []int64   `json:"lengths,omitempty"`
}

// File is the plan as the runtime reads it: per phase, a rule per named op of a layer (a split
// rule for a split MATMUL), the logits, then one rule without filters that places the rest (the
// norms and their weight multiply, the embedding lookup, reshapes and casts) on the norms' unit.
// Its units are the units the plan uses, in the profile's order.
func (p *Plan) File() *PlanFile {
	used := map[int]bool{}
	for _, ph := range []Phase{p.Prefill, p.Decode} {
		for _, op := range append(append([]OpPlan{}, ph.Layer...), ph.Head...) {
			for _, u := range op.Choice.Units {
				used[u] = true
			}
		}
	}
	f := &PlanFile{}
	for i, n := range p.Units {
		if used[i] {
			f.Units = append(f.Units, n)
		}
	}
	phase := func(ph Phase) FilePhase {
		var fp FilePhase
		if ph.Name == "prefill" {
			fp.Chunk = ph.Rows
		}
		rest := ""
		for _, op := range append(append([]OpPlan{}, ph.Layer...), ph.Head...) {
			c := op.Choice
			if op.Class == profile.OpNorm {
				rest = p.Units[c.Units[0]]
				continue
			}
			r := FileRule{Unit: p.Units[c.Units[0]], Nodes: op.Nodes}
			if c.Strategy != StrategySingle {
				sp := &FileSplit{Strategy: c.Strategy, Ratio: c.Ratio}
				for _, u := range c.Units {
					sp.Units = append(sp.Units, p.Units[u])
				}
				for _, l := range c.Lengths {
					sp.Lengths = append(sp.Lengths, int64(l))
				}
				if c.Strategy == StrategyMultiSeq {
					sp.Ratio = nil
				}
				r.Split = sp
			}
			fp.Rules = append(fp.Rules, r)
		}
		fp.Rules = append(fp.Rules, FileRule{Unit: rest})
		return fp
	}
	f.Prefill, f.Decode = phase(p.Prefill), phase(p.Decode)
	return f
}

// JSON is the plan file as indented JSON.
func (f *PlanFile) JSON() []byte {
	b, _ := json.MarshalIndent(f, "", "  ") // plain data
	return append(b, '\n')
}

// Describe is the placement of op as one line: "npu", "rows npu 75% + gpu 25%",
// "multiseq npu [512 32] + gpu rest".
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
	return c.Strategy + " " + strings.Join(parts, " + ")
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
	for _, m := range []Mode{Layer, Tensor} {
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
		if m == o.Mode || best == nil {
			best = pl
		}
	}
	return rows, best, nil
}
