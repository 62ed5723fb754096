package solve

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/xpuhub/xpu/sched"
	"github.com/xpuhub/xpu/sched/dag"
	"github.com/xpuhub/xpu/sched/profile"
)

// candidate is one assignment of choices to a layer's and the head's ops.
type candidate struct {
	label       string
	layer, head []Choice
	// stages, when set, is a layer split: the unit of every op of layer l (the head on the
	// last layer's unit), overriding layer and head
	stages []int
}

// singleChoice runs an op whole on unit u.
func singleChoice(u int) Choice { return Choice{Strategy: StrategySingle, Units: []int{u}} }

// within says every op's choice under c is among its options (a unit refuses no op).
func (c candidate) within(layerOpts, headOpts []map[uint64]Choice) bool {
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
					if _, rest := sched.DecomposeSeq(m, ls); rest == 0 {
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
		std, _ := sched.DecomposeSeq(m, static[:i+1])
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
	for _, u := range s.units {
		c := candidate{label: "single " + s.p.Units[u].Name}
		for range s.layer {
			c.layer = append(c.layer, singleChoice(u))
		}
		for range s.head {
			c.head = append(c.head, singleChoice(u))
		}
		if c.within(layerOpts, headOpts) {
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
	var pool []candidate
	seen := map[string]bool{}
	addPool := func(c candidate) {
		if !c.within(layerOpts, headOpts) {
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
							best, bt := singleChoice(a), time.Duration(math.MaxInt64)
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
							return singleChoice(b)
						}
						return singleChoice(r)
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
