package solve

import (
	"fmt"
	"math"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
	"github.com/xpuhub/xpu/sched/dag"
	"github.com/xpuhub/xpu/sched/profile"
)

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
		std, rest := sched.DecomposeSeq(m, c.Lengths)
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
// cut as the runner cuts them (sched.PlanShards.Cut, llm/shard/decode.go).
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
		std, _ := sched.DecomposeSeq(m, c.Lengths)
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
