package sched

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/safefile"
)

// Phase is a part of a request a plan places separately.
type Phase string

// Phases.
const (
	PhasePrefill Phase = "prefill"
	PhaseDecode  Phase = "decode"
)

// Plan says which unit runs which nodes, per phase: data, read from JSON (see PLAN.md in this
// package for the format and examples). Rules are tried in order; the first that matches a
// node places it. A node no rule matches is an error, as is a rule naming a unit the plan does
// not list.
type Plan struct {
	// Units are the unit specs the plan runs on (ParseUnitSpec text), in order.
	Units []string `json:"units"`
	// Prefill places the prompt's chunks; Decode the one-token steps. A phase without rules
	// uses the other phase's.
	Prefill PhasePlan `json:"prefill"`
	Decode  PhasePlan `json:"decode"`
}

// PhasePlan is one phase's placement.
type PhasePlan struct {
	// Chunk, for prefill, overrides the runner's chunk length (0: keep it).
	Chunk int    `json:"chunk,omitempty"`
	Rules []Rule `json:"rules"`
	// Shards, for decode, cuts every layer of a one-token step into one shard per unit
	// (tensor parallelism in Megatron-LM's form; PLAN.md, "Sharded decode"): each unit runs its
	// KV heads' Q, K and V projections, RoPE, attention and the matching columns of the
	// attention output projection, and its share of the FFN's neurons through gate, up,
	// activation and down, writing a partial sum; the residual adds (and the norms after
	// them) add the partial sums on the rules' unit. Two handoffs a layer remain, against one
	// per split MATMUL. The rules place everything else.
	Shards *Shards `json:"shards,omitempty"`
}

// Shards is a sharded decode's units and their shares.
type Shards struct {
	// Units are units of Plan.Units (as Rule.Unit names them), one per shard.
	Units []string `json:"units"`
	// Ratio is each shard's share of the KV heads and of the FFN's neurons; it sums to 1
	// (default: equal shares).
	Ratio []float64 `json:"ratio,omitempty"`
	// Adapt (two units) moves FFN neurons between the shards from token to token, by the
	// units' measured busy times, so that a core slowed down for a while (another process,
	// the host) gets fewer: the runner prepares a decode program per cut around Ratio.
	Adapt bool `json:"adapt,omitempty"`
	// Steal (two units) shares the FFN's neurons within each step instead: they are cut into
	// pieces, biggest at each unit's end, and each unit takes pieces from its end until none
	// is left (StageSpec.Shared), so the unit slower in that step runs fewer. Not with Adapt.
	Steal bool `json:"steal,omitempty"`
}

// PlanShards is a resolved Shards: units as indices into ResolvedPlan.Specs.
type PlanShards struct {
	Units        []int
	Ratio        []float64
	Adapt, Steal bool
}

// StealFractions are the sizes of the FFN pieces stealing shards cut from each unit's end, as
// shares of that unit's expected part: the stealing row split's (split_steal.go).
func (s *PlanShards) StealFractions() []float64 { return slices.Clone(stealFractions) }

// Cut splits n (KV heads, neurons) into one consecutive count per shard by the ratio, each cut
// a multiple of align where n allows (a quantized weight's block, so that a shard's columns
// are whole blocks). A count may be 0 where n is small.
func (s *PlanShards) Cut(n, align int64) []int64 { return cutPoints(n, s.Ratio, align) }

// Rule places the nodes it matches on a unit. Empty filters match everything.
type Rule struct {
	// Unit is a unit of Plan.Units, by its spec text (as written there or canonical) or its
	// position ("0", "1", ...).
	Unit string `json:"unit"`
	// Ops are op names (core.Op.String: "MATMUL", "ATTENTION", ...; case-insensitive).
	Ops []string `json:"ops,omitempty"`
	// Layers is a list of layer numbers and ranges: "0-11", "12-", "3,5-7".
	Layers string `json:"layers,omitempty"`
	// Nodes are path.Match patterns on node names without their "blk.N." layer prefix
	// ("ffn_*", "attn_output").
	Nodes []string `json:"nodes,omitempty"`
	// Fallback, when set, is the unit a node goes to when Unit refuses it (Context.Analyze);
	// without it a refusal fails the plan.
	Fallback string `json:"fallback,omitempty"`
	// Split, when set, cuts each MATMUL the rule matches across several units (see Split),
	// or with strategy heads each ATTENTION; the rule's other nodes, and the explicit merges a
	// split needs, go to Unit (default: the split's first unit).
	Split *Split `json:"split,omitempty"`
}

// Split cuts one MATMUL across units (PLAN.md, "Split MATMULs").
type Split struct {
	// Strategy is rows, seq, multiseq or hybrid for MATMULs, heads for ATTENTION
	// (SplitStrategy).
	Strategy SplitStrategy `json:"strategy"`
	// Units are units of Plan.Units (as Rule.Unit names them); multiseq and hybrid take two,
	// the static-shape unit first.
	Units []string `json:"units"`
	// Ratio is each unit's share of N (rows, hybrid), of M (seq) or of the KV heads (heads);
	// it sums to 1.
	Ratio []float64 `json:"ratio,omitempty"`
	// Lengths are the standard lengths the first unit holds graphs for (multiseq, hybrid).
	Lengths []int64 `json:"lengths,omitempty"`
	// Steal (rows over two units) shares the rows dynamically, from the ratio: each unit
	// takes chunks of them from its end until none are left (NodeSplit.Steal).
	Steal bool `json:"steal,omitempty"`
	// Adapt (rows over two units) moves the cut between the units from token to token, from
	// the parts' measured times, among cut points prepared around the ratio
	// (NodeSplit.Adapt).
	Adapt bool `json:"adapt,omitempty"`
}

// PlanSplit is a rule's split with its units as indices into ResolvedPlan.Specs.
type PlanSplit struct {
	Strategy SplitStrategy
	Units    []int
	Ratio    []float64
	Lengths  []int64
	Steal    bool
	Adapt    bool
}

// ErrBadPlan is wrapped by every plan error (and wraps core.ErrInvalidArgument).
var ErrBadPlan = fmt.Errorf("bad plan: %w", core.ErrInvalidArgument)

// ParsePlan reads a plan from JSON; unknown fields are errors (a misspelt filter would
// otherwise match everything).
func ParsePlan(data []byte) (*Plan, error) {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	var p Plan
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadPlan, err)
	}
	if _, err := p.Resolve(); err != nil {
		return nil, err
	}
	return &p, nil
}

// LoadPlan reads a plan file.
func LoadPlan(file string) (*Plan, error) {
	data, err := safefile.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	p, err := ParsePlan(data)
	if err != nil {
		return nil, fmt.Errorf("plan %s: %w", file, err)
	}
	return p, nil
}

// JSON is the plan as indented JSON, the format ParsePlan reads.
func (p *Plan) JSON() []byte {
	b, _ := json.MarshalIndent(p, "", "  ") // plain data: cannot fail
	return b
}

// ResolvedPlan is a plan checked and compiled for matching.
type ResolvedPlan struct {
	Specs  []UnitSpec
	phases map[Phase][]resolvedRule
	shards *PlanShards
}

// DecodeShards is the plan's sharded decode, or nil.
func (rp *ResolvedPlan) DecodeShards() *PlanShards { return rp.shards }

type resolvedRule struct {
	unit, fallback int // indices into Specs; fallback -1: none
	ops            []core.Op
	layers         [][2]int // inclusive ranges; hi -1: open
	nodes          []string
	split          *PlanSplit
	text           string // for messages
	where          string // "prefill rule 2", for messages
	// matched: the rule matched a node (CheckUse); shared by a phase that uses the other's rules
	matched *atomic.Bool
}

// Resolve parses the plan's units and rules.
func (p *Plan) Resolve() (*ResolvedPlan, error) {
	if len(p.Units) == 0 {
		return nil, fmt.Errorf("%w: no units", ErrBadPlan)
	}
	rp := &ResolvedPlan{phases: map[Phase][]resolvedRule{}}
	for _, s := range p.Units {
		spec, err := ParseUnitSpec(s)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadPlan, err)
		}
		for _, prev := range rp.Specs {
			if prev.String() == spec.String() {
				return nil, fmt.Errorf("%w: unit %s listed twice", ErrBadPlan, spec)
			}
		}
		rp.Specs = append(rp.Specs, spec)
	}
	for _, ph := range []struct {
		phase Phase
		pp    PhasePlan
	}{{PhasePrefill, p.Prefill}, {PhaseDecode, p.Decode}} {
		if ph.pp.Chunk < 0 {
			return nil, fmt.Errorf("%w: %s chunk %d", ErrBadPlan, ph.phase, ph.pp.Chunk)
		}
		if ph.pp.Shards != nil {
			if ph.phase != PhaseDecode {
				return nil, fmt.Errorf("%w: %s shards: only decode steps are sharded", ErrBadPlan, ph.phase)
			}
			var err error
			if rp.shards, err = rp.resolveShards(ph.pp.Shards); err != nil {
				return nil, fmt.Errorf("%w: decode shards: %w", ErrBadPlan, err)
			}
		}
		for i, r := range ph.pp.Rules {
			rr, err := rp.resolveRule(r)
			if err != nil {
				return nil, fmt.Errorf("%w: %s rule %d: %w", ErrBadPlan, ph.phase, i, err)
			}
			rr.where, rr.matched = fmt.Sprintf("%s rule %d", ph.phase, i), new(atomic.Bool)
			rp.phases[ph.phase] = append(rp.phases[ph.phase], rr)
		}
	}
	switch {
	case len(rp.phases[PhasePrefill]) == 0 && len(rp.phases[PhaseDecode]) == 0:
		return nil, fmt.Errorf("%w: no rules", ErrBadPlan)
	case len(rp.phases[PhasePrefill]) == 0:
		rp.phases[PhasePrefill] = rp.phases[PhaseDecode]
	case len(rp.phases[PhaseDecode]) == 0:
		rp.phases[PhaseDecode] = rp.phases[PhasePrefill]
	}
	return rp, nil
}

// unitIndex finds a unit by spec text or position.
func (rp *ResolvedPlan) unitIndex(s string) (int, error) {
	if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil {
		if n < 0 || n >= len(rp.Specs) {
			return 0, fmt.Errorf("unit #%d: the plan has %d units", n, len(rp.Specs))
		}
		return n, nil
	}
	spec, err := ParseUnitSpec(s)
	if err != nil {
		return 0, err
	}
	for i, u := range rp.Specs {
		if u.String() == spec.String() {
			return i, nil
		}
	}
	names := make([]string, len(rp.Specs))
	for i, u := range rp.Specs {
		names[i] = u.String()
	}
	return 0, fmt.Errorf("unit %s is not one of the plan's units (%s)", spec, strings.Join(names, ", "))
}

func (rp *ResolvedPlan) resolveShards(s *Shards) (*PlanShards, error) {
	ratio := s.Ratio
	if len(ratio) == 0 && len(s.Units) > 0 {
		ratio = make([]float64, len(s.Units))
		for i := range ratio {
			ratio[i] = 1 / float64(len(ratio))
		}
	}
	if err := validateSplit(SplitRows, len(s.Units), ratio, nil); err != nil {
		return nil, err
	}
	if (s.Adapt || s.Steal) && len(s.Units) != 2 {
		return nil, fmt.Errorf("adapt and steal are for two units, not %d", len(s.Units))
	}
	if s.Adapt && s.Steal {
		return nil, fmt.Errorf("adapt and steal together: the neurons either move between steps or are shared within one")
	}
	ps := &PlanShards{Ratio: slices.Clone(ratio), Adapt: s.Adapt, Steal: s.Steal}
	for _, u := range s.Units {
		i, err := rp.unitIndex(u)
		if err != nil {
			return nil, err
		}
		if slices.Contains(ps.Units, i) {
			return nil, fmt.Errorf("unit %s listed twice", rp.Specs[i])
		}
		ps.Units = append(ps.Units, i)
	}
	return ps, nil
}

func (rp *ResolvedPlan) resolveRule(r Rule) (resolvedRule, error) {
	rr := resolvedRule{fallback: -1}
	b, _ := json.Marshal(r)
	rr.text = string(b)
	var err error
	if r.Split != nil {
		sp := r.Split
		if r.Fallback != "" {
			return rr, fmt.Errorf("split and fallback together: a split's units cannot fall back")
		}
		if err := validateSplit(sp.Strategy, len(sp.Units), sp.Ratio, sp.Lengths); err != nil {
			return rr, err
		}
		if (sp.Steal || sp.Adapt) && (sp.Strategy != SplitRows || len(sp.Units) != 2) {
			return rr, fmt.Errorf("split: steal and adapt are for rows splits over two units")
		}
		if sp.Steal && sp.Adapt {
			return rr, fmt.Errorf("split: steal and adapt together: a split either steals chunks or moves its cut")
		}
		rr.split = &PlanSplit{Strategy: sp.Strategy, Ratio: slices.Clone(sp.Ratio), Lengths: slices.Clone(sp.Lengths),
			Steal: sp.Steal, Adapt: sp.Adapt}
		for _, u := range sp.Units {
			i, err := rp.unitIndex(u)
			if err != nil {
				return rr, fmt.Errorf("split: %w", err)
			}
			if slices.Contains(rr.split.Units, i) {
				return rr, fmt.Errorf("split: unit %s listed twice", rp.Specs[i])
			}
			rr.split.Units = append(rr.split.Units, i)
		}
		if r.Unit == "" {
			r.Unit = strconv.Itoa(rr.split.Units[0])
		}
	}
	if rr.unit, err = rp.unitIndex(r.Unit); err != nil {
		return rr, err
	}
	if r.Fallback != "" {
		if rr.fallback, err = rp.unitIndex(r.Fallback); err != nil {
			return rr, fmt.Errorf("fallback: %w", err)
		}
	}
	for _, o := range r.Ops {
		if o == "*" {
			rr.ops = nil
			break
		}
		op, err := core.ParseOp(o)
		if err != nil {
			return rr, err
		}
		rr.ops = append(rr.ops, op)
	}
	if rr.layers, err = parseLayers(r.Layers); err != nil {
		return rr, err
	}
	for _, n := range r.Nodes {
		if _, err := path.Match(n, ""); err != nil {
			return rr, fmt.Errorf("node pattern %q: %w", n, err)
		}
	}
	rr.nodes = r.Nodes
	return rr, nil
}

// parseLayers reads "0-11,14,16-".
func parseLayers(s string) ([][2]int, error) {
	var out [][2]int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(strings.TrimSpace(lo))
		if err != nil || a < 0 {
			return nil, fmt.Errorf("layers %q: %q is not a layer number", s, lo)
		}
		b := a
		if isRange {
			if hi = strings.TrimSpace(hi); hi == "" {
				b = -1
			} else if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("layers %q: bad range %q", s, part)
			}
		}
		out = append(out, [2]int{a, b})
	}
	return out, nil
}

func (rr *resolvedRule) matches(layer int, n *core.Node) bool {
	if len(rr.ops) > 0 && !slices.Contains(rr.ops, n.Op) {
		return false
	}
	if len(rr.layers) > 0 {
		in := false
		for _, r := range rr.layers {
			if layer >= r[0] && (r[1] < 0 || layer <= r[1]) {
				in = true
				break
			}
		}
		if !in {
			return false
		}
	}
	if len(rr.nodes) > 0 {
		name := n.Name
		if strings.HasPrefix(name, "blk.") {
			if i := strings.IndexByte(name[4:], '.'); i >= 0 {
				name = name[4+i+1:]
			}
		}
		for _, p := range rr.nodes {
			if ok, _ := path.Match(p, name); ok {
				return true
			}
		}
		return false
	}
	return true
}

// PlaceSplit is Place plus the split of the matching rule when n is a node that rule splits:
// a MATMUL, or an ATTENTION under a heads split (nil otherwise).
func (rp *ResolvedPlan) PlaceSplit(phase Phase, layer int, n *core.Node) (unit, fallback int, split *PlanSplit, err error) {
	first := -1
	for i, rr := range rp.phases[phase] {
		if rr.matches(layer, n) {
			// every matching rule counts as used (CheckUse), not only the first, which places
			if rr.matched != nil {
				rr.matched.Store(true)
			}
			if first < 0 {
				first = i
			}
		}
	}
	if first < 0 {
		return 0, -1, nil, fmt.Errorf("%s node %s (%s, layer %d): %w", phase, n.Name, n.Op, layer, ErrNoRule)
	}
	rr := rp.phases[phase][first]
	if rr.split != nil && rr.split.Strategy.splits(n.Op) {
		split = rr.split
	}
	return rr.unit, rr.fallback, split, nil
}

// CheckUse reports, once every node of a model with layers layers has been placed, the rules
// written for another model: a rule naming a layer the model does not have, and a rule that
// matched no node (a node name, op or layer the model lacks, or a typo). Both are ErrBadPlan,
// as a rule naming a unit the plan does not list is.
func (rp *ResolvedPlan) CheckUse(layers int) error {
	var errs []error
	seen := map[*atomic.Bool]bool{}
	for _, ph := range []Phase{PhasePrefill, PhaseDecode} {
		for _, rr := range rp.phases[ph] {
			if rr.matched == nil || seen[rr.matched] {
				continue
			}
			seen[rr.matched] = true
			for _, r := range rr.layers {
				if hi := max(r[0], r[1]); hi >= layers {
					errs = append(errs, fmt.Errorf("%w: %s %s: layer %d is beyond the model's %d layers (0-%d)",
						ErrBadPlan, rr.where, rr.text, hi, layers, layers-1))
					break
				}
			}
			if !rr.matched.Load() {
				errs = append(errs, fmt.Errorf("%w: %s %s matches no node of the model (an op, node name or layer it does not have?)",
					ErrBadPlan, rr.where, rr.text))
			}
		}
	}
	return errors.Join(errs...)
}

// ErrNoRule: no rule of the plan matches a node.
var ErrNoRule = errors.New("no plan rule matches the node")

// Place returns the unit (index into Specs) for node n of layer in phase, and the fallback
// unit (-1: none). A MATMUL its rule splits gets the unit of the split's merges (PlaceSplit
// also gives the split).
func (rp *ResolvedPlan) Place(phase Phase, layer int, n *core.Node) (unit, fallback int, err error) {
	unit, fallback, _, err = rp.PlaceSplit(phase, layer, n)
	return unit, fallback, err
}

// DefaultPlan is the plan --units gives without a plan file (no solver yet: a fixed rule over
// the units' device kinds, documented in PLAN.md):
//   - one unit: everything on it;
//   - units all of one device kind (e.g. two pinned CPU units): the layers split into
//     contiguous, near-equal ranges in unit order, so prefill chunks pipeline across them;
//   - otherwise: MATMULs on the unit of the most matmul-oriented kind (NPU, then GPU, then
//     accelerator, then CPU; the first listed on ties), ATTENTION on a third unit if there is
//     one (a GPU first), everything else on the first CPU unit (or the first unit that is not
//     the MATMUL unit). Each MATMUL or ATTENTION a unit refuses falls back to the rest unit.
//
// kinds are the units' device kinds, layers the model's layer count.
func DefaultPlan(specs []UnitSpec, kinds []core.DeviceKind, layers int) *Plan {
	p := &Plan{}
	for _, s := range specs {
		p.Units = append(p.Units, s.String())
	}
	if len(specs) <= 1 {
		p.Prefill.Rules = []Rule{{Unit: "0"}}
		return p
	}
	same := true
	for _, k := range kinds {
		same = same && k == kinds[0]
	}
	if same {
		n := len(specs)
		for i := range n {
			lo, hi := i*layers/n, (i+1)*layers/n-1
			r := Rule{Unit: strconv.Itoa(i), Layers: fmt.Sprintf("%d-%d", lo, hi)}
			if i == n-1 {
				r.Layers = fmt.Sprintf("%d-", lo)
			}
			if hi >= lo || i == n-1 {
				p.Prefill.Rules = append(p.Prefill.Rules, r)
			}
		}
		return p
	}
	rank := map[core.DeviceKind]int{core.DeviceNPU: 4, core.DeviceGPU: 3, core.DeviceAccel: 2, core.DeviceCPU: 1}
	mm := 0
	for i, k := range kinds {
		if rank[k] > rank[kinds[mm]] {
			mm = i
		}
	}
	rest := -1
	for i, k := range kinds {
		if i != mm && k == core.DeviceCPU {
			rest = i
			break
		}
	}
	if rest < 0 {
		rest = 0
		if mm == 0 {
			rest = 1
		}
	}
	attn := -1
	for i, k := range kinds {
		if i != mm && i != rest && (attn < 0 || k == core.DeviceGPU && kinds[attn] != core.DeviceGPU) {
			attn = i
		}
	}
	r := strconv.Itoa(rest)
	p.Prefill.Rules = append(p.Prefill.Rules, Rule{Unit: strconv.Itoa(mm), Ops: []string{core.OpMatMul.String()}, Fallback: r})
	if attn >= 0 {
		p.Prefill.Rules = append(p.Prefill.Rules, Rule{Unit: strconv.Itoa(attn), Ops: []string{core.OpAttention.String()}, Fallback: r})
	}
	p.Prefill.Rules = append(p.Prefill.Rules, Rule{Unit: r})
	return p
}

// DefaultPlanPartial is DefaultPlan where some units are partial (partial[i]): their device
// runs only a few ops (llm.DefaultPlan calls a unit partial when its device refuses the
// model's MATMULs), so placing by device kind would hand them MATMULs they refuse and nothing
// else. The kind rules place the nodes over the other units; then each rule that takes every
// op (a catch-all, or a layer range of the same-kind split) is preceded by the same rule on the
// first partial unit, falling back to that rule's unit: every node outside the MATMUL and
// ATTENTION rules is offered to the partial unit first, and what it refuses (Context.Analyze)
// runs where the kind rules put it. With no partial unit, or only partial ones, it is DefaultPlan.
func DefaultPlanPartial(specs []UnitSpec, kinds []core.DeviceKind, partial []bool, layers int) *Plan {
	var full []int // indices of the units that are not partial
	first := -1
	for i := range specs {
		if i < len(partial) && partial[i] {
			if first < 0 {
				first = i
			}
			continue
		}
		full = append(full, i)
	}
	if first < 0 || len(full) == 0 {
		return DefaultPlan(specs, kinds, layers)
	}
	subSpecs := make([]UnitSpec, len(full))
	subKinds := make([]core.DeviceKind, len(full))
	for j, i := range full {
		subSpecs[j], subKinds[j] = specs[i], kinds[i]
	}
	sub := DefaultPlan(subSpecs, subKinds, layers)
	// the sub plan names its units by position among the full ones: back to positions in specs
	remap := func(u string) string {
		if u == "" {
			return ""
		}
		j, err := strconv.Atoi(u)
		if err != nil || j < 0 || j >= len(full) {
			return u
		}
		return strconv.Itoa(full[j])
	}
	p := &Plan{}
	for _, s := range specs {
		p.Units = append(p.Units, s.String())
	}
	offer := strconv.Itoa(first)
	for _, r := range sub.Prefill.Rules {
		r.Unit, r.Fallback = remap(r.Unit), remap(r.Fallback)
		if len(r.Ops) == 0 && len(r.Nodes) == 0 && r.Split == nil && r.Fallback == "" {
			p.Prefill.Rules = append(p.Prefill.Rules, Rule{Unit: offer, Layers: r.Layers, Fallback: r.Unit})
		}
		p.Prefill.Rules = append(p.Prefill.Rules, r)
	}
	return p
}
