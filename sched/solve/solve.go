// Package solve chooses, from a profile, where a model's ops run: per phase (prefill in chunks
// of a chosen length, decode one token at a time) and per op of a decoder layer (every layer
// has the same shapes, so the same decision), the unit, or for a MATMUL a split across units
// (HeteroLLM's row, sequence, multi-sequence and hybrid cuts) with its ratio, or for decode a
// split of the attention by KV heads or a sharded decode (StrategyShard). It predicts each
// candidate by replaying the phase's task DAG (package dag) on a discrete-event clock with the
// profile's costs and sync times, and returns the fastest; the candidates always include
// every single unit, so a plan is never predicted slower than the best single unit.
//
// The same code serves measured profiles and simulated ones (package soc): every time it
// reports is a prediction from the profile.
package solve

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched/dag"
	"github.com/xpuhub/xpu/sched/profile"
)

// Mode bounds what the solver may choose.
type Mode int

// Modes.
const (
	// Tensor lets a MATMUL be split across units (HeteroLLM's Hetero-tensor), a decode step's
	// attention by KV heads, and a decode step be sharded (StrategyShard).
	Tensor Mode = iota
	// Layer runs every op whole on one unit, different ops on different units (Hetero-layer,
	// mllm-NPU's placement).
	Layer
	// Single runs everything on one unit.
	Single
	// LayerSplit runs contiguous layer ranges on different units (a pipeline across chunks:
	// the runtime's default plan for units of one kind). Layer and Tensor consider it too.
	LayerSplit
)

func (m Mode) String() string {
	switch m {
	case Tensor:
		return "tensor-level"
	case Layer:
		return "layer-level"
	case LayerSplit:
		return "layer split"
	}
	return "single unit"
}

// ErrNoPlan is wrapped when no candidate can run (every unit refuses some op).
var ErrNoPlan = errors.New("solve: no feasible plan")

// Options configure Solve.
type Options struct {
	// Units are the profile's units to use, by name (nil: all).
	Units []string
	// Prompt is the prompt length prefill is predicted for (0: 1024).
	Prompt int
	// Context is the KV length decode is predicted at (0: Prompt).
	Context int
	// Chunks are the prefill chunk lengths to consider (nil: the powers of two from 32 to
	// 1024 up to the prompt, and the prompt itself when it is at most 1024).
	Chunks []int
	Mode   Mode
	// Policy dispatches prefill's ready tasks (nil: dag.OutOfOrder).
	Policy dag.Policy
	// Steal writes every rows split over two units as a stealing one (sched.NodeSplit.Steal),
	// and a sharded decode as stealing shards (sched.Shards.Steal):
	// the units share the weight rows at run time, starting from the solver's ratio, so a
	// unit slower than its profile says does less instead of the other waiting. It costs
	// memory where a backend repacks weights: each unit then holds every chunk of those
	// weights, not only its part. The predicted times are the static split's.
	Steal bool
	// Adapt writes every rows split over two units as an adaptive one
	// (sched.NodeSplit.Adapt), and a sharded decode as adaptive shards (sched.Shards.Adapt):
	// in decode the cut moves from token to token, around the solver's ratio, by the parts'
	// measured times. It costs prepare time (each unit prepares its part
	// at 9 cut points). The predicted times are the static split's. Not with Steal.
	Adapt bool
}

// Strategies a Choice can have.
const (
	StrategySingle   = "single"
	StrategyRows     = "rows"
	StrategySeq      = "seq"
	StrategyMultiSeq = "multiseq"
	StrategyHybrid   = "hybrid"
	// StrategyHeads splits a decode step's ATTENTION by KV heads (sched.SplitHeads), where the
	// profile has the units' ATTENTION_HEADS times.
	StrategyHeads = "heads"
	// StrategyShard is a sharded decode (sched.Shards): each unit runs its share of the KV
	// heads from Q/K/V to its columns of the output projection and its share of the FFN
	// neurons from gate/up to its columns of the down projection, the units meeting at the
	// residual adds and where a stage starts (attention) instead of at every MATMUL. Every
	// sharded op of a phase has the same units and ratio.
	StrategyShard = "shard"
)

// Choice is how one op runs: on one unit, or split.
type Choice struct {
	Strategy string
	// Units are profile unit indices; for multiseq and hybrid the static-shape unit first.
	Units []int
	// Ratio is each unit's share of N (rows, hybrid; the query heads, heads) or of M (seq).
	Ratio []float64
	// Lengths are the standard lengths Units[0] runs (multiseq, hybrid).
	Lengths []int
}

func (c Choice) mask() uint64 {
	var m uint64
	for _, u := range c.Units {
		m |= 1 << uint(u)
	}
	return m
}

// OpPlan is the decision for one op and its predicted time alone (chunk rows, average KV).
type OpPlan struct {
	Op     string
	Class  string
	Nodes  []string
	Choice Choice
	Time   time.Duration
	// BestSingle is the fastest single unit for the op alone and its time: what a split is
	// measured against ("does splitting pay").
	BestSingle     int
	BestSingleTime time.Duration
}

// Phase is the plan of one phase.
type Phase struct {
	Name string // "prefill" or "decode"
	// Rows is the chunk length (prefill) or 1 (decode); Chunks how many chunks the prompt takes.
	Rows, Chunks int
	// Candidate says which candidate won ("single npu", "layer-level chain", ...).
	Candidate string
	Layer     []OpPlan
	Head      []OpPlan
	// LayerUnits, when set, is a layer split (pipeline): every op of layer l, and the head after
	// the last layer, runs on unit LayerUnits[l]; Layer then describes layer 0's placement.
	LayerUnits []int
	// Time is the predicted time of the phase: the whole prompt, or one decode token.
	Time time.Duration
	// TokPerSec is the predicted throughput: prompt tokens (prefill) or tokens (decode) per s.
	TokPerSec float64
	// Sim is the replay the prediction comes from.
	Sim *dag.Result
}

// Plan is the solver's result.
type Plan struct {
	Source  string   // the profile's source ("measured", "simulated:sd8gen3")
	Model   string   // the model's name
	Units   []string // every unit of the profile, by index
	Used    []int    // the units the solver could choose from
	Mode    Mode
	Policy  string
	Prompt  int
	Context int
	Steal   bool // Options.Steal
	Adapt   bool // Options.Adapt
	Prefill Phase
	Decode  Phase
	// SinglePrefill and SingleDecode are the best single-unit plans (the floor a plan is never
	// predicted slower than).
	SinglePrefill, SingleDecode Phase
}

// Solve finds the plan of model prof.Model over prof's units.
func Solve(prof *profile.Profile, o Options) (*Plan, error) {
	if prof == nil {
		return nil, fmt.Errorf("solve: nil profile: %w", core.ErrInvalidArgument)
	}
	if err := prof.Validate(); err != nil {
		return nil, err
	}
	if len(prof.Units) > 64 {
		return nil, fmt.Errorf("solve: %d units (at most 64): %w", len(prof.Units), core.ErrInvalidArgument)
	}
	s := &solver{p: prof, o: o, memo: map[memoKey]cost{}}
	if s.o.Prompt <= 0 {
		s.o.Prompt = 1024
	}
	if s.o.Context <= 0 {
		s.o.Context = s.o.Prompt
	}
	if s.o.Policy == nil {
		s.o.Policy = dag.OutOfOrder
	}
	if s.o.Units == nil {
		for i := range prof.Units {
			s.units = append(s.units, i)
		}
	} else {
		for _, n := range s.o.Units {
			i := prof.UnitIndex(n)
			if i < 0 {
				names := make([]string, len(prof.Units))
				for k, u := range prof.Units {
					names[k] = u.Name
				}
				return nil, fmt.Errorf("solve: unit %q is not in the profile (there are: %s): %w", n, strings.Join(names, ", "), core.ErrNotFound)
			}
			if !slices.Contains(s.units, i) {
				s.units = append(s.units, i)
			}
		}
	}
	if len(s.units) == 0 {
		return nil, fmt.Errorf("solve: no units: %w", core.ErrInvalidArgument)
	}
	s.layer, s.head = layerOps(prof.Model)
	chunks := s.o.Chunks
	if chunks == nil {
		for c := 32; c <= 1024 && c <= s.o.Prompt; c *= 2 {
			chunks = append(chunks, c)
		}
		if s.o.Prompt <= 1024 && !slices.Contains(chunks, s.o.Prompt) {
			chunks = append(chunks, s.o.Prompt)
		}
	}
	// the prefill DAG has a task per op, layer and chunk and attention edges to every earlier
	// chunk: bound the chunks so a replay stays milliseconds, not minutes
	var ok []int
	for _, c := range chunks {
		if c < 1 {
			return nil, fmt.Errorf("solve: chunk length %d: %w", c, core.ErrInvalidArgument)
		}
		if (s.o.Prompt+c-1)/c <= maxChunks {
			ok = append(ok, c)
		}
	}
	if len(ok) == 0 {
		return nil, fmt.Errorf("solve: a %d-token prompt in chunks of %v is over %d chunks: %w", s.o.Prompt, chunks, maxChunks, core.ErrInvalidArgument)
	}
	chunks = ok
	plan := &Plan{Source: prof.Source, Model: prof.Model.Name, Used: slices.Clone(s.units), Mode: o.Mode,
		Policy: s.o.Policy.Name(), Prompt: s.o.Prompt, Context: s.o.Context, Steal: o.Steal,
		Adapt: o.Adapt}
	for _, u := range prof.Units {
		plan.Units = append(plan.Units, u.Name)
	}
	var err error
	if plan.Prefill, plan.SinglePrefill, err = s.phase("prefill", chunks); err != nil {
		return nil, err
	}
	if plan.Decode, plan.SingleDecode, err = s.phase("decode", []int{1}); err != nil {
		return nil, err
	}
	return plan, nil
}

// maxChunks bounds the chunks of a replayed prefill.
const maxChunks = 256
