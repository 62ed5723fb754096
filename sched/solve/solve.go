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
	"math"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
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

type solver struct {
	p           *profile.Profile
	o           Options
	units       []int
	layer, head []opDef
	memo        map[memoKey]cost
	names       [][]string // step names per layer and op
}

type memoKey struct {
	u int
	q profile.Query
}

type cost struct {
	t   time.Duration
	err error
}

// time is the profile's time for q on unit u, memoized.
func (s *solver) time(u int, q profile.Query) (time.Duration, error) {
	k := memoKey{u, q}
	if c, ok := s.memo[k]; ok {
		return c.t, c.err
	}
	t, err := s.p.Time(u, q)
	s.memo[k] = cost{t, err}
	return t, err
}

// candidate is one assignment of choices to a layer's and the head's ops.
type candidate struct {
	label       string
	layer, head []Choice
	// stages, when set, is a layer split: the unit of every op of layer l (the head on the
	// last layer's unit), overriding layer and head
	stages []int
}

// layerChoice is the choice for op j of layer l under c.
func (c candidate) layerChoice(l, j int) Choice {
	if c.stages != nil {
		return Choice{Strategy: StrategySingle, Units: []int{c.stages[l]}}
	}
	return c.layer[j]
}

// headChoice is the choice for head op j under c.
func (c candidate) headChoice(j int) Choice {
	if c.stages != nil {
		return Choice{Strategy: StrategySingle, Units: []int{c.stages[len(c.stages)-1]}}
	}
	return c.head[j]
}

// phase solves one phase over the given row counts (chunk lengths) and returns the best plan
// and the best single-unit plan.
func (s *solver) phase(name string, rowsList []int) (best, single Phase, err error) {
	var pool []scored
	foundSingle := false
	var singleC candidate
	singleRows, singleChunks := 0, 0
	var singleT time.Duration
	for _, rows := range rowsList {
		nchunks, kvAvg := 1, s.o.Context
		if name == "prefill" {
			nchunks = (s.o.Prompt + rows - 1) / rows
			kvAvg = (s.o.Prompt + rows) / 2
		}
		cands, singles := s.candidates(rows, kvAvg, nchunks)
		pool = append(pool, cands...)
		if name == "decode" && s.o.Mode == Tensor {
			pool = append(pool, s.shards(rows, kvAvg)...)
		}
		// one unit runs its tasks back to back: the replay's makespan is the sum of the costs
		for _, c := range singles {
			t, err := s.serialTime(name, c, rows, nchunks)
			if err != nil {
				return best, single, err
			}
			if !foundSingle || t < singleT {
				singleC, singleRows, singleChunks, singleT, foundSingle = c, rows, nchunks, t, true
			}
		}
	}
	if foundSingle {
		if single, err = s.evaluate(name, singleC, singleRows, singleChunks, s.o.Policy); err != nil {
			return best, single, err
		}
		best = single
	}
	sort.SliceStable(pool, func(i, j int) bool { return pool[i].bound < pool[j].bound })
	found := foundSingle
	taken := map[Mode]int{}
	for _, x := range pool {
		if taken[x.family] >= replayed {
			continue
		}
		taken[x.family]++
		ph, err := s.evaluate(name, x.c, x.rows, x.nchunks, s.o.Policy)
		if err != nil {
			return best, single, err
		}
		if !found || ph.Time < best.Time {
			best, found = ph, true
		}
	}
	if !found {
		return best, single, fmt.Errorf("%w for %s on units %v: every unit refuses some op", ErrNoPlan, name, s.unitNames(s.units))
	}
	if !foundSingle {
		single = best
	}
	return best, single, nil
}

// serialTime is the sum of every task's cost of candidate c: its replay's makespan when one
// unit runs everything.
func (s *solver) serialTime(name string, c candidate, rows, nchunks int) (time.Duration, error) {
	var total time.Duration
	for i := range nchunks {
		steps, err := s.chunkSteps(name, c, i, rows)
		if err != nil {
			return 0, err
		}
		for _, st := range steps {
			for _, p := range st.Parts {
				total += p.Cost
			}
		}
	}
	return total, nil
}

// chunkShape is chunk i's rows and KV length: prefill's chunks of rows (the last what is left
// of the prompt), decode's one row at the context length.
func (s *solver) chunkShape(name string, i, rows int) (m, kv int) {
	if name != "prefill" {
		return rows, s.o.Context
	}
	m = min(rows, s.o.Prompt-i*rows)
	return m, i*rows + m
}

func (s *solver) unitNames(us []int) []string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = s.p.Units[u].Name
	}
	return out
}

// opTime is op's predicted time under choice c for m rows over kv keys, with its per-unit
// parts (a split's parts run at the same time; with a combined bandwidth cap, each part
// streams at most its unit's share of it).
func (s *solver) opTime(op opDef, c Choice, m, kv int) (time.Duration, []dag.Part, error) {
	q := op.query(m, kv)
	passes := time.Duration(max(op.passes, 1))
	type piece struct {
		unit  int
		t     time.Duration
		bytes int64
	}
	var ps []piece
	run := func(u int, rows, n int) (time.Duration, int64, error) {
		if rows <= 0 || n <= 0 {
			return 0, 0, nil
		}
		qq := q
		qq.M, qq.N = rows, n
		t, err := s.time(u, qq)
		var b int64
		if op.matmul {
			b = profile.WeightBytes(q.DType, q.K, n)
		}
		return t * passes, b, err
	}
	align := func(units []int) int {
		a := 1
		for _, u := range units {
			a = max(a, s.p.Units[u].RowAlign)
		}
		return a
	}
	switch c.Strategy {
	case StrategySingle:
		t, b, err := run(c.Units[0], m, q.N)
		if err != nil {
			return 0, nil, err
		}
		ps = append(ps, piece{c.Units[0], t, b})
	case StrategyRows:
		ns := splitCount(q.N, c.Ratio, align(c.Units))
		for i, u := range c.Units {
			t, b, err := run(u, m, ns[i])
			if err != nil {
				return 0, nil, err
			}
			ps = append(ps, piece{u, t, b})
		}
	case StrategyShard:
		if op.shard == shardNone {
			return 0, nil, fmt.Errorf("solve: %s is not sharded", op.Name)
		}
		for i, f := range s.shardShares(op.shard, c.Ratio) {
			if f == 0 {
				continue
			}
			qq := q
			scale := func(v int) int { return max(1, int(math.Round(float64(v)*f))) }
			switch {
			case op.Class == profile.OpAttention:
				qq.Op, qq.N = profile.OpAttentionHeads, scale(q.N)
			case op.cols:
				qq.K = scale(q.K)
			default:
				qq.N = scale(q.N)
			}
			t, err := s.time(c.Units[i], qq)
			if err != nil {
				return 0, nil, err
			}
			var b int64
			if op.matmul {
				b = profile.WeightBytes(q.DType, qq.K, qq.N)
			}
			ps = append(ps, piece{c.Units[i], t * passes, b})
		}
	case StrategyHeads:
		for i, n := range splitCount(q.N, c.Ratio, max(op.headAlign, 1)) {
			if n == 0 {
				continue
			}
			qq := q
			qq.Op, qq.N = profile.OpAttentionHeads, n
			t, err := s.time(c.Units[i], qq)
			if err != nil {
				return 0, nil, err
			}
			ps = append(ps, piece{c.Units[i], t * passes, 0})
		}
	case StrategySeq:
		ms := splitCount(m, c.Ratio, 1)
		for i, u := range c.Units {
			t, b, err := run(u, ms[i], q.N)
			if err != nil {
				return 0, nil, err
			}
			ps = append(ps, piece{u, t, b})
		}
	case StrategyMultiSeq, StrategyHybrid:
		std, rest := decomposeSeq(m, c.Lengths)
		na, nb := q.N, 0
		if c.Strategy == StrategyHybrid {
			ns := splitCount(q.N, c.Ratio, align(c.Units))
			na, nb = ns[0], ns[1]
		}
		var a, bt piece
		a.unit, bt.unit = c.Units[0], c.Units[1]
		for _, l := range std {
			t, b, err := run(a.unit, l, na)
			if err != nil {
				return 0, nil, err
			}
			a.t, a.bytes = a.t+t, a.bytes+b
			t, b, err = run(bt.unit, l, nb)
			if err != nil {
				return 0, nil, err
			}
			bt.t, bt.bytes = bt.t+t, bt.bytes+b
		}
		t, b, err := run(bt.unit, rest, q.N)
		if err != nil {
			return 0, nil, err
		}
		bt.t, bt.bytes = bt.t+t, bt.bytes+b
		ps = append(ps, a, bt)
	default:
		return 0, nil, fmt.Errorf("solve: strategy %q", c.Strategy)
	}
	if len(ps) > 1 && s.p.CombinedGBs > 0 {
		var sumBW float64
		for _, p := range ps {
			sumBW += s.p.Units[p.unit].GBs
		}
		for i, p := range ps {
			if bw := s.p.Units[p.unit].GBs; bw > 0 && p.bytes > 0 && sumBW > 0 {
				share := s.p.CombinedGBs * 1e9 * bw / sumBW
				ps[i].t = max(p.t, time.Duration(float64(p.bytes)/share*1e9))
			}
		}
	}
	if len(ps) > 1 {
		// the parts are cut to end together but each unit's time varies from run to run
		// (Unit.Jitter): the op ends with the later part, E[max(a, b)] ≤ T + E|a−b|/2, and
		// E|a−b| ≤ the sum of each part's mean absolute deviation; every part is charged it,
		// since its unit waits for the other before the op's consumers run
		var tmax time.Duration
		var spread float64
		for _, p := range ps {
			tmax = max(tmax, p.t)
			spread += s.p.Units[p.unit].Jitter
		}
		wait := time.Duration(float64(tmax) * spread / 2)
		for i := range ps {
			if ps[i].t > 0 {
				ps[i].t += wait
			}
		}
	}
	var total time.Duration
	parts := make([]dag.Part, 0, len(ps))
	for _, p := range ps {
		total = max(total, p.t)
		if p.t > 0 {
			parts = append(parts, dag.Part{Unit: p.unit, Cost: p.t, Name: s.p.Units[p.unit].Name})
		}
	}
	if len(parts) == 0 {
		parts = append(parts, dag.Part{Unit: c.Units[0]})
	}
	// the op's time includes its merge (a step of its own in the replay, see chunkSteps)
	mc, err := s.mergeTime(op, c, m, kv)
	if err != nil {
		return 0, nil, err
	}
	return total + mc, parts, nil
}

// blockLen is the quantization block of weight type dt (1 for float weights or one that does
// not parse).
func blockLen(dt string) int {
	d, err := core.ParseDType(dt)
	if err != nil {
		return 1
	}
	return int(d.BlockLen())
}

// shardShares are each unit's share of an op of a sharded decode with ratio: of the KV heads
// (whole heads) or of the FFN's neurons (whole blocks of the weights' quantization, and of 32),
// cut as the runner cuts them (sched.PlanShards.Cut, llm/shard.go).
func (s *solver) shardShares(side int, ratio []float64) []float64 {
	total, align := int64(s.p.Model.KVHeads), int64(1)
	if side == shardNeurons {
		total, align = int64(s.p.Model.FFN), 32
		align = max(align, int64(blockLen(s.p.Model.DType)))
	}
	out := make([]float64, len(ratio))
	for i, n := range (&sched.PlanShards{Ratio: ratio}).Cut(total, align) {
		out[i] = float64(n) / float64(total)
	}
	return out
}

// splitCount cuts total into len(ratio) parts by ratio, each but the last a multiple of align.
func splitCount(total int, ratio []float64, align int) []int {
	out := make([]int, len(ratio))
	left := total
	for i, r := range ratio {
		if i == len(ratio)-1 {
			out[i] = left
			break
		}
		v := int(math.Round(r*float64(total)/float64(align))) * align
		v = min(max(v, 0), left)
		out[i], left = v, left-v
	}
	return out
}

// decomposeSeq is the standard lengths (largest first, each at most once) that fit in m, and
// the remainder (the runtime's rule, sched.DecomposeSeq on the partitioning branch).
func decomposeSeq(m int, lengths []int) (std []int, rest int) {
	ls := slices.Clone(lengths)
	slices.Sort(ls)
	slices.Reverse(ls)
	rest = m
	for _, l := range ls {
		if l > 0 && l <= rest {
			std = append(std, l)
			rest -= l
		}
	}
	return std, rest
}

// options are op's choices for m rows over kv keys, best per set of units: every single unit
// that runs it, and in Tensor mode every split of a MATMUL over two units.
func (s *solver) options(op opDef, m, kv int) map[uint64]Choice {
	out := map[uint64]Choice{}
	best := map[uint64]time.Duration{}
	try := func(c Choice) {
		t, _, err := s.opTime(op, c, m, kv)
		if err != nil {
			return
		}
		k := c.mask()
		if b, ok := best[k]; !ok || t < b {
			out[k], best[k] = c, t
		}
	}
	for _, u := range s.units {
		try(Choice{Strategy: StrategySingle, Units: []int{u}})
	}
	if s.o.Mode == Tensor && op.headAlign > 0 && m == 1 {
		// a decode step's attention by KV heads (the runtime runs a chunk's whole)
		q := op.query(m, kv).N
		for _, a := range s.units {
			for _, b := range s.units {
				if a < b {
					for na := op.headAlign; na < q; na += op.headAlign {
						r := float64(na) / float64(q)
						try(Choice{Strategy: StrategyHeads, Units: []int{a, b}, Ratio: []float64{r, 1 - r}})
					}
				}
			}
		}
	}
	if s.o.Mode != Tensor || !op.matmul {
		return out
	}
	n := op.query(m, kv).N
	for _, a := range s.units {
		for _, b := range s.units {
			if a == b {
				continue
			}
			ua, ub := &s.p.Units[a], &s.p.Units[b]
			if a < b { // rows and seq are symmetric in the two units
				al := max(ua.RowAlign, ub.RowAlign, 32)
				for _, na := range grid(n, al) {
					r := float64(na) / float64(n)
					try(Choice{Strategy: StrategyRows, Units: []int{a, b}, Ratio: []float64{r, 1 - r}})
				}
			}
			if m > 1 && len(ua.StaticM) == 0 && len(ub.StaticM) == 0 && a < b {
				for _, ma := range grid(m, 32) {
					r := float64(ma) / float64(m)
					try(Choice{Strategy: StrategySeq, Units: []int{a, b}, Ratio: []float64{r, 1 - r}})
				}
			}
			if m > 1 && len(ua.StaticM) > 0 {
				for _, ls := range lengthSets(m, ua.StaticM) {
					if _, rest := decomposeSeq(m, ls); rest == 0 {
						continue // the static unit alone, or rows when cut by N
					}
					try(Choice{Strategy: StrategyMultiSeq, Units: []int{a, b}, Lengths: ls})
					al := max(ua.RowAlign, ub.RowAlign, 32)
					for _, na := range grid(n, al) {
						r := float64(na) / float64(n)
						try(Choice{Strategy: StrategyHybrid, Units: []int{a, b}, Ratio: []float64{r, 1 - r}, Lengths: ls})
					}
				}
			}
		}
	}
	return out
}

// grid is the multiples of align below n, at most 32 of them (evenly spaced).
func grid(n, align int) []int {
	step := align
	if n/step > 32 {
		step = (n/32 + align - 1) / align * align
	}
	var out []int
	for v := step; v < n; v += step {
		out = append(out, v)
	}
	return out
}

// lengthSets are the standard-length sets worth trying for m rows on a unit with static sizes:
// for each largest size ≤ m, the greedy decomposition of m into distinct sizes no larger, and
// each prefix of it (the rest goes to the other unit).
func lengthSets(m int, static []int) [][]int {
	var out [][]int
	for i := len(static) - 1; i >= 0; i-- {
		if static[i] > m {
			continue
		}
		std, _ := decomposeSeq(m, static[:i+1])
		for k := 1; k <= len(std); k++ {
			ls := slices.Clone(std[:k])
			if !slices.ContainsFunc(out, func(o []int) bool { return slices.Equal(o, ls) }) {
				out = append(out, ls)
			}
		}
	}
	return out
}

// candidates are the assignments worth replaying for chunks of rows rows: every single unit
// that runs everything, and (Layer, Tensor) the latency-optimal chain per norm unit and the
// placements by op class (MATMULs, attention, the rest), pruned to the best few by a bound.
func (s *solver) candidates(rows, kv, nchunks int) (cands []scored, singles []candidate) {
	layerOpts := make([]map[uint64]Choice, len(s.layer))
	for i, op := range s.layer {
		layerOpts[i] = s.options(op, rows, kv)
	}
	headOpts := make([]map[uint64]Choice, len(s.head))
	for i, op := range s.head {
		headOpts[i] = s.options(op, rows, kv)
	}
	single := func(u int) Choice { return Choice{Strategy: StrategySingle, Units: []int{u}} }
	feasible := func(c candidate) bool {
		for i, ch := range c.layer {
			if _, ok := layerOpts[i][ch.mask()]; !ok {
				return false
			}
		}
		for i, ch := range c.head {
			if _, ok := headOpts[i][ch.mask()]; !ok {
				return false
			}
		}
		return true
	}
	for _, u := range s.units {
		c := candidate{label: "single " + s.p.Units[u].Name}
		for range s.layer {
			c.layer = append(c.layer, single(u))
		}
		for range s.head {
			c.head = append(c.head, single(u))
		}
		if feasible(c) {
			singles = append(singles, c)
		}
	}
	if s.o.Mode == Single {
		return nil, singles
	}
	cands = s.pipelines(layerOpts, headOpts, rows, kv, nchunks)
	if s.o.Mode == LayerSplit {
		return cands, singles
	}
	cands = append(cands, s.multi(layerOpts, headOpts, rows, kv, nchunks, s.o.Mode)...)
	if s.o.Mode == Tensor {
		// the layer-level candidates too, generated and ranked exactly as in Layer mode, so
		// a tensor-level plan is never predicted slower than the layer-level one
		whole := func(opts []map[uint64]Choice) []map[uint64]Choice {
			out := make([]map[uint64]Choice, len(opts))
			for i, o := range opts {
				out[i] = map[uint64]Choice{}
				for k, c := range o {
					if c.Strategy == StrategySingle {
						out[i][k] = c
					}
				}
			}
			return out
		}
		cands = append(cands, s.multi(whole(layerOpts), whole(headOpts), rows, kv, nchunks, Layer)...)
	}
	return cands, singles
}

// multi is the multi-unit candidates over the given options, scored by their bound: the
// latency-optimal chain over every set of units and the placements by op class.
func (s *solver) multi(layerOpts, headOpts []map[uint64]Choice, rows, kv, nchunks int, family Mode) (cands []scored) {
	single := func(u int) Choice { return Choice{Strategy: StrategySingle, Units: []int{u}} }
	feasible := func(c candidate) bool {
		for i, ch := range c.layer {
			if _, ok := layerOpts[i][ch.mask()]; !ok {
				return false
			}
		}
		for i, ch := range c.head {
			if _, ok := headOpts[i][ch.mask()]; !ok {
				return false
			}
		}
		return true
	}
	var pool []candidate
	seen := map[string]bool{}
	addPool := func(c candidate) {
		if !feasible(c) {
			return
		}
		k := fmt.Sprint(c.layer, c.head)
		if !seen[k] {
			seen[k] = true
			pool = append(pool, c)
		}
	}
	// the chain: for every set of two or more units and every norm unit in it, the assignment
	// of least one-chunk latency using only those units (a subset's best is then also a
	// candidate of the whole set, so more units never predict slower)
	all := uint64(0)
	for _, u := range s.units {
		all |= 1 << uint(u)
	}
	for sub := all; sub > 0; sub = (sub - 1) & all {
		if bits.OnesCount64(sub) < 2 {
			continue
		}
		for _, nu := range s.units {
			if sub&(1<<uint(nu)) == 0 {
				continue
			}
			if c, ok := s.chain(layerOpts, headOpts, nu, sub, rows, kv); ok {
				addPool(c)
			}
		}
	}
	// by op class: MATMULs around unit a (whole, or its best split with a, within the units of
	// the assignment or with any unit), attention on b, the rest on r
	for _, a := range s.units {
		for _, b := range s.units {
			for _, r := range s.units {
				within := uint64(1)<<uint(a) | uint64(1)<<uint(b) | uint64(1)<<uint(r)
				for _, limit := range []uint64{within, all} {
					c := candidate{label: fmt.Sprintf("classes: matmul %s, attention %s, rest %s", s.p.Units[a].Name, s.p.Units[b].Name, s.p.Units[r].Name)}
					pick := func(op opDef, opts map[uint64]Choice) Choice {
						switch {
						case op.matmul:
							best, bt := single(a), time.Duration(math.MaxInt64)
							for k, ch := range opts {
								if k&(1<<uint(a)) == 0 || k&^limit != 0 {
									continue
								}
								if t, _, err := s.opTime(op, ch, rows, kv); err == nil && (t < bt || (t == bt && k < best.mask())) {
									best, bt = ch, t
								}
							}
							return best
						case op.Class == profile.OpAttention:
							return single(b)
						}
						return single(r)
					}
					for i, op := range s.layer {
						c.layer = append(c.layer, pick(op, layerOpts[i]))
					}
					for i, op := range s.head {
						c.head = append(c.head, pick(op, headOpts[i]))
					}
					addPool(c)
				}
			}
		}
	}
	for _, c := range pool {
		cands = append(cands, s.score(c, rows, kv, nchunks, family))
	}
	return cands
}

// score ranks candidate c by the bound max(busiest unit's load × chunks, chain latency + the
// rest of the chunks at the busiest unit's pace).
func (s *solver) score(c candidate, rows, kv, nchunks int, family Mode) scored {
	load := map[int]time.Duration{}
	var lat time.Duration
	prev, prevShard := uint64(0), false
	add := func(op opDef, ch Choice) {
		t, parts, err := s.opTime(op, ch, rows, kv)
		if err != nil {
			return
		}
		for _, p := range parts {
			load[p.Unit] += p.Cost
		}
		if !(ch.Strategy == StrategyShard && prevShard) { // a shard's ops run as one task
			lat += s.transition(prev, ch.mask())
		}
		lat += t
		prev, prevShard = ch.mask(), ch.Strategy == StrategyShard
	}
	for range s.p.Model.Layers {
		for i, op := range s.layer {
			add(op, c.layer[i])
		}
	}
	for i, op := range s.head {
		add(op, c.head[i])
	}
	var busiest time.Duration
	for _, l := range load {
		busiest = max(busiest, l)
	}
	return scored{c: c, rows: rows, nchunks: nchunks, family: family,
		bound: max(busiest*time.Duration(nchunks), lat+busiest*time.Duration(nchunks-1))}
}

// shardFamily ranks the sharded decodes among themselves.
const shardFamily Mode = -2

// shards are the sharded decodes (StrategyShard) over every two units of one kind without
// static shapes, the KV heads cut at every whole head and the neurons by the same ratio, the
// ops the shards meet at and the head on either of the two: the runtime's default plan shards
// decode over units of one kind (llm.DefaultPlan), and a unit of static shapes would pad each
// shard's one-row ops. Each unit runs its shard's ops as one task between meetings, so a
// layer has three meetings (the residual adds and the start of attention) where a rows split
// meets at every MATMUL.
func (s *solver) shards(rows, kv int) []scored {
	kvh := s.p.Model.KVHeads
	var out []scored
	for _, a := range s.units {
		for _, b := range s.units {
			ua, ub := &s.p.Units[a], &s.p.Units[b]
			if a >= b || ua.Kind != ub.Kind || len(ua.StaticM) > 0 || len(ub.StaticM) > 0 {
				continue
			}
			for h := 1; h < kvh; h++ {
				r := float64(h) / float64(kvh)
				if slices.Contains(s.shardShares(shardNeurons, []float64{r, 1 - r}), 0) {
					continue // the runner refuses a shard without neurons (a small FFN)
				}
				if cols := h * s.p.Model.Heads / kvh * s.p.Model.HeadDim; cols%blockLen(s.p.Model.DType) != 0 {
					continue // nor one whose output-projection columns start inside a quantization block
				}
				shard := Choice{Strategy: StrategyShard, Units: []int{a, b}, Ratio: []float64{r, 1 - r}}
			meet:
				for _, nu := range []int{a, b} {
					single := Choice{Strategy: StrategySingle, Units: []int{nu}}
					c := candidate{label: fmt.Sprintf("sharded: %s %d + %s %d KV heads, meeting on %s",
						ua.Name, h, ub.Name, kvh-h, s.p.Units[nu].Name)}
					for _, op := range s.layer {
						ch := single
						if op.shard != shardNone {
							ch = shard
						}
						if _, _, err := s.opTime(op, ch, rows, kv); err != nil {
							continue meet // a unit refuses an op (or has no ATTENTION_HEADS time)
						}
						c.layer = append(c.layer, ch)
					}
					for _, op := range s.head {
						if _, _, err := s.opTime(op, single, rows, kv); err != nil {
							continue meet
						}
						c.head = append(c.head, single)
					}
					out = append(out, s.score(c, rows, kv, 1, shardFamily))
				}
			}
		}
	}
	return out
}

// pipelineFamily ranks the layer splits among themselves (they are replayed apart from the
// per-op placements, as the runtime's default plan for units of one kind is one).
const pipelineFamily Mode = -1

// maxPipelineUnits bounds the unit orders a layer split is tried over (the permutations of
// every subset).
const maxPipelineUnits = 4

// pipelines are the layer splits (Hetero-layer's pipeline, the runtime's default plan for
// units of one kind): for every order of two or more units, contiguous layer ranges in that
// order, every op of a layer on its range's unit and the head on the last; prefill chunks then
// pipeline across the units. Over two units every cut is a candidate; over more, the cut
// that balances each unit's layer time. Scored by the same bound as multi.
func (s *solver) pipelines(layerOpts, headOpts []map[uint64]Choice, rows, kv, nchunks int) []scored {
	L := s.p.Model.Layers
	if L < 2 || len(s.units) < 2 || len(s.units) > maxPipelineUnits {
		return nil
	}
	// per unit: one layer's time and the head's (ok false where the unit refuses an op)
	layerT, headT := map[int]time.Duration{}, map[int]time.Duration{}
	runsLayer, runsHead := map[int]bool{}, map[int]bool{}
	for _, u := range s.units {
		k := uint64(1) << uint(u)
		runsLayer[u], runsHead[u] = true, true
		for i, op := range s.layer {
			ch, ok := layerOpts[i][k]
			if !ok {
				runsLayer[u] = false
				break
			}
			t, _, err := s.opTime(op, ch, rows, kv)
			if err != nil {
				runsLayer[u] = false
				break
			}
			layerT[u] += t
		}
		for i, op := range s.head {
			ch, ok := headOpts[i][k]
			if !ok {
				runsHead[u] = false
				break
			}
			t, _, err := s.opTime(op, ch, rows, kv)
			if err != nil {
				runsHead[u] = false
				break
			}
			headT[u] += t
		}
	}
	var out []scored
	add := func(order []int, cuts []int) { // cuts[i]: the first layer of order[i+1]
		stages := make([]int, L)
		lo := 0
		load := map[int]time.Duration{}
		var lat time.Duration
		for i, u := range order {
			hi := L
			if i < len(cuts) {
				hi = cuts[i]
			}
			if hi <= lo {
				return
			}
			for l := lo; l < hi; l++ {
				stages[l] = u
			}
			load[u] += layerT[u] * time.Duration(hi-lo)
			lat += layerT[u] * time.Duration(hi-lo)
			if i > 0 {
				lat += s.p.SyncCost(order[i-1], u)
			}
			lo = hi
		}
		last := order[len(order)-1]
		load[last] += headT[last]
		lat += headT[last]
		var busiest time.Duration
		for _, l := range load {
			busiest = max(busiest, l)
		}
		var parts []string
		lo = 0
		for i, u := range order {
			hi := L
			if i < len(cuts) {
				hi = cuts[i]
			}
			parts = append(parts, fmt.Sprintf("%d-%d on %s", lo, hi-1, s.p.Units[u].Name))
			lo = hi
		}
		c := candidate{label: "layer split: " + strings.Join(parts, ", "), stages: stages}
		out = append(out, scored{c: c, rows: rows, nchunks: nchunks, family: pipelineFamily,
			bound: max(busiest*time.Duration(nchunks), lat+busiest*time.Duration(nchunks-1))})
	}
	var perm func(order []int, used uint64)
	perm = func(order []int, used uint64) {
		if len(order) >= 2 && runsHead[order[len(order)-1]] {
			if len(order) == 2 {
				for cut := 1; cut < L; cut++ {
					add(order, []int{cut})
				}
			} else if len(order) <= L {
				// each unit's share of the layers in proportion to its speed
				var inv float64
				for _, u := range order {
					inv += 1 / max(layerT[u].Seconds(), 1e-12)
				}
				cuts := make([]int, 0, len(order)-1)
				acc := 0.0
				for _, u := range order[:len(order)-1] {
					acc += 1 / max(layerT[u].Seconds(), 1e-12) / inv
					cut := int(math.Round(acc * float64(L)))
					if n := len(cuts); n > 0 {
						cut = max(cut, cuts[n-1]+1)
					} else {
						cut = max(cut, 1)
					}
					cuts = append(cuts, min(cut, L-(len(order)-1-len(cuts))))
				}
				add(order, cuts)
			}
		}
		for _, u := range s.units {
			if used&(1<<uint(u)) == 0 && runsLayer[u] {
				perm(append(slices.Clone(order), u), used|1<<uint(u))
			}
		}
	}
	perm(nil, 0)
	return out
}

// scored is a multi-unit candidate for one chunk length with its estimated time.
type scored struct {
	c             candidate
	rows, nchunks int
	family        Mode // Layer (no splits) or Tensor
	bound         time.Duration
}

// replayed is how many multi-unit candidates of each family (the best by their bound, over
// every chunk length) a phase replays on the DAG clock.
const replayed = 12

// maskUnits lists the units of a mask.
func maskUnits(m uint64) []int {
	var out []int
	for u := 0; m != 0; u++ {
		if m&1 != 0 {
			out = append(out, u)
		}
		m >>= 1
	}
	return out
}

// transition is the sync a step on units next pays after a step on units prev: the largest
// handoff from a unit of prev to a different unit of next.
func (s *solver) transition(prev, next uint64) time.Duration {
	var t time.Duration
	for a := range s.p.Units {
		if prev&(1<<uint(a)) == 0 {
			continue
		}
		for b := range s.p.Units {
			if a != b && next&(1<<uint(b)) != 0 {
				t = max(t, s.p.SyncCost(a, b))
			}
		}
	}
	return t
}

// chain is the assignment of least one-chunk latency (op times plus handoffs, the layer
// repeating) with the norms on unit nu, by dynamic programming over the unit sets of each
// op's options; ok is false when some op has no option.
func (s *solver) chain(layerOpts, headOpts []map[uint64]Choice, nu int, within uint64, rows, kv int) (candidate, bool) {
	type state struct {
		t    time.Duration
		prev uint64
	}
	opts := func(i int) map[uint64]Choice {
		if s.layer[i].isNorm() {
			k := uint64(1) << uint(nu)
			if c, ok := layerOpts[i][k]; ok {
				return map[uint64]Choice{k: c}
			}
			return nil
		}
		o := map[uint64]Choice{}
		for k, c := range layerOpts[i] {
			if k&^within == 0 {
				o[k] = c
			}
		}
		return o
	}
	timeOf := func(op opDef, c Choice) time.Duration {
		t, _, err := s.opTime(op, c, rows, kv)
		if err != nil {
			return time.Duration(math.MaxInt64 / 4)
		}
		return t
	}
	first := uint64(1) << uint(nu) // the layer starts with attn_norm on nu
	if len(opts(0)) == 0 {
		return candidate{}, false
	}
	dp := []map[uint64]state{{first: {t: timeOf(s.layer[0], opts(0)[first])}}}
	for i := 1; i < len(s.layer); i++ {
		cur := map[uint64]state{}
		for k, c := range opts(i) {
			t0 := timeOf(s.layer[i], c)
			for pk, ps := range dp[i-1] {
				t := ps.t + s.transition(pk, k) + t0
				if st, ok := cur[k]; !ok || t < st.t || (t == st.t && pk < st.prev) {
					cur[k] = state{t, pk}
				}
			}
		}
		if len(cur) == 0 {
			return candidate{}, false
		}
		dp = append(dp, cur)
	}
	last, lt := uint64(0), time.Duration(math.MaxInt64)
	for k, st := range dp[len(dp)-1] {
		if t := st.t + s.transition(k, first); t < lt || (t == lt && k < last) {
			last, lt = k, t
		}
	}
	c := candidate{label: fmt.Sprintf("chain over %s (norms on %s)", strings.Join(s.unitNames(maskUnits(within)), "+"), s.p.Units[nu].Name),
		layer: make([]Choice, len(s.layer))}
	k := last
	for i := len(s.layer) - 1; i >= 0; i-- {
		c.layer[i] = opts(i)[k]
		k = dp[i][k].prev
	}
	// the head: its norm on nu, logits' best option after it
	prev := first
	for i, op := range s.head {
		o := headOpts[i]
		if op.isNorm() {
			ch, ok := o[first]
			if !ok {
				return candidate{}, false
			}
			c.head = append(c.head, ch)
			continue
		}
		var best Choice
		bt := time.Duration(math.MaxInt64)
		for k, ch := range o {
			if k&^within != 0 {
				continue
			}
			if t := timeOf(op, ch) + s.transition(prev, k); t < bt || (t == bt && k < best.mask()) {
				best, bt = ch, t
			}
		}
		if bt == time.Duration(math.MaxInt64) {
			return candidate{}, false
		}
		c.head = append(c.head, best)
		prev = best.mask()
	}
	return c, true
}

// evaluate replays candidate c for the phase and returns the phase's plan.
func (s *solver) evaluate(name string, c candidate, rows, nchunks int, pol dag.Policy) (Phase, error) {
	d, err := s.build(name, c, rows, nchunks)
	if err != nil {
		return Phase{}, err
	}
	res, err := simulate(s.p, d, pol)
	if err != nil {
		return Phase{}, err
	}
	ph := Phase{Name: name, Rows: rows, Chunks: nchunks, Candidate: c.label, Time: res.Makespan, Sim: res,
		LayerUnits: slices.Clone(c.stages)}
	tokens := 1
	if name == "prefill" {
		tokens = s.o.Prompt
	}
	if res.Makespan > 0 {
		ph.TokPerSec = float64(tokens) / res.Makespan.Seconds()
	}
	kv := s.o.Context
	if name == "prefill" {
		kv = (s.o.Prompt + rows) / 2
	}
	describe := func(op opDef, ch Choice) OpPlan {
		t, _, _ := s.opTime(op, ch, rows, kv)
		op1 := OpPlan{Op: op.Name, Class: op.Class, Nodes: op.Nodes, Choice: ch, Time: t, BestSingle: -1}
		for _, u := range s.units {
			if tu, _, err := s.opTime(op, Choice{Strategy: StrategySingle, Units: []int{u}}, rows, kv); err == nil &&
				(op1.BestSingle < 0 || tu < op1.BestSingleTime) {
				op1.BestSingle, op1.BestSingleTime = u, tu
			}
		}
		return op1
	}
	for i, op := range s.layer {
		ph.Layer = append(ph.Layer, describe(op, c.layerChoice(0, i)))
	}
	for i, op := range s.head {
		ph.Head = append(ph.Head, describe(op, c.headChoice(i)))
	}
	return ph, nil
}

// build is the phase's task DAG for candidate c, with the runtime's dependencies
// (sched.Program's plan): per chunk, every layer's ops then the head's, grouped into the
// runtime's tasks (chunkSteps), each task after the one before it; a stage (it starts at a
// layer's attention) waits for the chunk's previous stage and the previous chunk's previous
// stage (the K/V rows attention reads); a chunk's first task waits for the end of the chunk
// that used its lane before: prefill over more than one unit has two lanes (two chunks in
// flight, so a layer split pipelines), otherwise one. A chunk's rows: rows, the last one what
// is left of the prompt (a static-shape unit pads it).
func (s *solver) build(name string, c candidate, rows, nchunks int) (*dag.DAG, error) {
	d, err := dag.New(len(s.p.Units))
	if err != nil {
		return nil, err
	}
	lanes := 1
	if name == "prefill" && bits.OnesCount64(c.mask()) > 1 {
		lanes = 2
	}
	// stageEnd[i][k]: the tasks that end chunk i's stage k
	stageEnd := make([][][]int, 0, nchunks)
	for i := range nchunks {
		steps, err := s.chunkSteps(name, c, i, rows)
		if err != nil {
			return nil, err
		}
		var ends [][]int
		var prev []int
		for j, st := range steps {
			var deps []int
			switch {
			case j == 0:
				if i >= lanes {
					le := stageEnd[i-lanes]
					deps = append(deps, le[len(le)-1]...)
				}
			case st.CrossChunk:
				ends = append(ends, prev)
				deps = append(deps, prev...)
				if i > 0 && len(ends) <= len(stageEnd[i-1]) {
					deps = append(deps, stageEnd[i-1][len(ends)-1]...)
				}
			default:
				deps = prev
			}
			nonzero := slices.ContainsFunc(st.Parts, func(p dag.Part) bool { return p.Cost > 0 })
			var ids []int
			for _, p := range st.Parts {
				if p.Cost <= 0 && nonzero {
					continue
				}
				tn := "c" + strconv.Itoa(i) + "/" + st.Name
				if p.Name != "" {
					tn += "#" + p.Name
				}
				id, err := d.Add(dag.Task{Name: tn, Unit: p.Unit, Cost: p.Cost, Deps: deps, Chunk: i, Layer: st.Layer})
				if err != nil {
					return nil, err
				}
				ids = append(ids, id)
			}
			prev = ids
		}
		ends = append(ends, prev)
		stageEnd = append(stageEnd, ends)
	}
	return d, nil
}

// mask is the set of units candidate c uses.
func (c candidate) mask() uint64 {
	var m uint64
	for _, u := range c.stages {
		m |= 1 << uint(u)
	}
	if c.stages == nil {
		for _, ch := range append(append([]Choice{}, c.layer...), c.head...) {
			m |= ch.mask()
		}
	}
	return m
}

// chunkSteps is chunk i's steps under candidate c, grouped into the runtime's tasks.
func (s *solver) chunkSteps(name string, c candidate, i, rows int) ([]dag.Step, error) {
	if s.names == nil {
		s.names = make([][]string, s.p.Model.Layers+1)
		for l := range s.names {
			for _, op := range append(append([]opDef{}, s.layer...), s.head...) {
				s.names[l] = append(s.names[l], "blk."+strconv.Itoa(l)+"."+op.Name)
			}
		}
	}
	var ferr error
	m, kv := s.chunkShape(name, i, rows)
	steps := make([]taskStep, 0, s.p.Model.Layers*len(s.layer)+len(s.head))
	// the merges of the split MATMULs just added, run after their parts on the first unit
	var merge *taskStep
	flush := func() {
		if merge != nil {
			steps = append(steps, *merge)
			merge = nil
		}
	}
	add := func(l, j int, op opDef, ch Choice) {
		_, parts, err := s.opTime(op, ch, m, kv)
		if err != nil && ferr == nil {
			ferr = fmt.Errorf("solve: %s %s on %v: %w", name, op.Name, s.unitNames(ch.Units), err)
		}
		mc, err := s.mergeTime(op, ch, m, kv)
		if err != nil && ferr == nil {
			ferr = fmt.Errorf("solve: %s %s merge on %s: %w", name, op.Name, s.p.Units[ch.Units[0]].Name, err)
		}
		// sibling splits (Q, K, V; gate, up) share a task per unit, their merges follow them
		if merge != nil && !(op.matmul && slices.Equal(merge.units, ch.Units)) {
			flush()
		}
		steps = append(steps, taskStep{Step: dag.Step{Name: s.names[l][j], Layer: l, Parts: parts,
			CrossChunk: op.Class == profile.OpAttention}, matmul: op.matmul, shard: ch.Strategy == StrategyShard})
		if mc > 0 {
			if merge == nil {
				merge = &taskStep{Step: dag.Step{Name: s.names[l][j] + ".merge", Layer: l,
					Parts: []dag.Part{{Unit: ch.Units[0], Name: s.p.Units[ch.Units[0]].Name}}}, units: ch.Units}
			}
			merge.Parts[0].Cost += mc
		}
	}
	for l := range s.p.Model.Layers {
		for j, op := range s.layer {
			add(l, j, op, c.layerChoice(l, j))
		}
	}
	for j, op := range s.head {
		add(s.p.Model.Layers, len(s.layer)+j, op, c.headChoice(j))
	}
	flush()
	return s.group(steps), ferr
}

// taskStep is a step before grouping.
type taskStep struct {
	dag.Step
	matmul bool
	shard  bool  // a sharded decode's op: each unit runs its shards' ops as one task
	units  []int // a merge's split units
}

// mergeTime is the cost of the merge a split of op adds for m rows: the runtime writes a
// part's output in place where its slice of y is contiguous (seq, multiseq, one-row cuts),
// but column pieces of several rows (rows, hybrid's standard blocks) get slots of their own
// and a CONCAT on the split's first unit, a pass over [m, N] priced as an element-wise op of
// that shape on that unit.
func (s *solver) mergeTime(op opDef, c Choice, m, kv int) (time.Duration, error) {
	if !op.matmul || m <= 1 || (c.Strategy != StrategyRows && c.Strategy != StrategyHybrid) {
		return 0, nil
	}
	rows := m
	if c.Strategy == StrategyHybrid {
		std, _ := decomposeSeq(m, c.Lengths)
		rows = 0
		for _, l := range std {
			rows += l
		}
		if rows == 0 {
			return 0, nil
		}
	}
	q := op.query(m, kv)
	return s.time(c.Units[0], profile.Query{Op: profile.OpElementwise, M: rows, N: q.N})
}

// group merges steps into the runtime's tasks. The runtime cuts each stage graph (llm/graph.go:
// a stage starts at a layer's attention and ends after the next layer's Q/K/V and RoPE) into
// partitions, runs of nodes on one unit, and runs each partition as one task; split MATMULs
// that follow each other with the same units and no dependency between them (Q, K, V; gate,
// up) share one task per unit, and so do a sharded decode's ops from one meeting to the next
// (sched.StageSpec.Sharded: each unit's shard is a partition, a stage's attention still starts
// a task). A task pays its unit's fixed cost (submit, dispatch, fence) once,
// where the profile's op times each include it: a group of k ops costs the sum less k−1
// launches. So a plan that cuts a layer into many small tasks is charged what the runtime pays.
func (s *solver) group(steps []taskStep) []dag.Step {
	out := make([]dag.Step, 0, len(steps))
	units := func(st dag.Step) []int {
		us := make([]int, len(st.Parts))
		for i, p := range st.Parts {
			us[i] = p.Unit
		}
		return us
	}
	prevMatmul, prevShard := false, false
	for _, st := range steps {
		if n := len(out); n > 0 && !st.CrossChunk && slices.Equal(units(out[n-1]), units(st.Step)) &&
			(len(st.Parts) == 1 || (st.matmul && prevMatmul) || (st.shard && prevShard)) {
			last := &out[n-1]
			parts := slices.Clone(last.Parts)
			for i, p := range st.Parts {
				launch := seconds(s.p.Units[p.Unit].LaunchSeconds)
				parts[i].Cost += max(p.Cost-launch, p.Cost/2)
			}
			last.Parts = parts
			prevMatmul, prevShard = st.matmul, st.shard
			continue
		}
		out = append(out, st.Step)
		prevMatmul, prevShard = st.matmul, st.shard
	}
	return out
}

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
// lab/notes/2026-11-23-profiler-and-solver-xpu-tune-profile-xpu.md.) A simulated
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
