package solve

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/xpuhub/xpu/sched/dag"
	"github.com/xpuhub/xpu/sched/profile"
)

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

// group merges steps into the runtime's tasks. The runtime cuts each stage graph (llm/arch/stage.go:
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
