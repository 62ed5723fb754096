package dag

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const ms = time.Millisecond

func TestAddValidates(t *testing.T) {
	_, err := New(0)
	require.ErrorIs(t, err, ErrBadDAG)
	d, err := New(2)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		task Task
	}{
		{"unit out of range", Task{Unit: 2}},
		{"negative unit", Task{Unit: -1}},
		{"negative cost", Task{Cost: -1}},
		{"forward dependency", Task{Deps: []int{0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.Add(tc.task)
			require.ErrorIs(t, err, ErrBadDAG)
		})
	}
	a := d.MustAdd(Task{Cost: ms})
	b := d.MustAdd(Task{Unit: 1, Cost: 2 * ms, Deps: []int{a, a}})
	assert.Equal(t, []int{a}, d.Tasks[b].Deps, "duplicate dependencies are kept once")
	assert.Equal(t, []int{b}, d.Users(a))
	assert.Equal(t, []time.Duration{ms, 2 * ms}, d.Work())
	assert.Equal(t, 1, d.Bottleneck())
	assert.Equal(t, 3*ms, d.CriticalPath())
}

func TestSimulateExact(t *testing.T) {
	// a(u0,2) → b(u1,3); a → c(u0,1); b,c → e(u0,1)
	d, _ := New(2)
	a := d.MustAdd(Task{Name: "a", Unit: 0, Cost: 2 * ms})
	b := d.MustAdd(Task{Name: "b", Unit: 1, Cost: 3 * ms, Deps: []int{a}})
	c := d.MustAdd(Task{Name: "c", Unit: 0, Cost: 1 * ms, Deps: []int{a}})
	d.MustAdd(Task{Name: "e", Unit: 0, Cost: 1 * ms, Deps: []int{b, c}})
	for _, p := range Policies() {
		r, err := Simulate(d, p)
		require.NoError(t, err, p.Name())
		assert.Equal(t, 6*ms, r.Makespan, p.Name())
		assert.Equal(t, []time.Duration{4 * ms, 3 * ms}, r.Busy)
		assert.Equal(t, []time.Duration{2 * ms, 3 * ms}, r.Idle)
		assert.Equal(t, 0, r.Busiest)
		assert.InDelta(t, 2.0/6, r.Bubble, 1e-9)
		assert.Equal(t, [][]int{{0, 2, 3}, {1}}, r.Order)
	}
	// a cross-unit handoff of 1 ms delays b and then e
	r, err := Simulate(d, FIFO, WithSync(func(from, to int) time.Duration { return ms }))
	require.NoError(t, err)
	assert.Equal(t, 8*ms, r.Makespan)
	assert.Equal(t, 3*ms, r.Slots[slices.IndexFunc(r.Slots, func(s Slot) bool { return s.Task == b })].Start)
	assert.Contains(t, r.String(), "predicted")
}

// randomDAG is a layered random DAG with unequal costs on units units.
func randomDAG(rng *rand.Rand, units, n int) *DAG {
	d, _ := New(units)
	for i := range n {
		var deps []int
		for k := 0; k < 3 && i > 0; k++ {
			if rng.IntN(2) == 0 {
				deps = append(deps, rng.IntN(i))
			}
		}
		d.MustAdd(Task{Unit: rng.IntN(units), Cost: time.Duration(1+rng.IntN(50)) * 100 * time.Microsecond, Deps: deps, Chunk: i / 10})
	}
	return d
}

func TestSimulateRespectsDependenciesAndUnits(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		d := randomDAG(rng, 1+rng.IntN(4), 1+rng.IntN(60))
		sync := time.Duration(rng.IntN(3)) * 100 * time.Microsecond
		slow := 1 + 2*rng.Float64()*float64(rng.IntN(2)) // half the trials share the units
		for _, p := range Policies() {
			r, err := Simulate(d, p, WithSync(func(int, int) time.Duration { return sync }),
				WithSlowdown(func(int) float64 { return slow }))
			require.NoError(t, err, "trial %d %s", trial, p.Name())
			require.Len(t, r.Slots, len(d.Tasks))
			at := make([]Slot, len(d.Tasks))
			var busy time.Duration
			for _, s := range r.Slots {
				at[s.Task] = s
				if slow == 1 {
					assert.Equal(t, d.Tasks[s.Task].Cost, s.End-s.Start)
				} else {
					assert.GreaterOrEqual(t, s.End-s.Start, d.Tasks[s.Task].Cost)
					assert.LessOrEqual(t, float64(s.End-s.Start), slow*float64(d.Tasks[s.Task].Cost)+1)
				}
				busy += s.End - s.Start
			}
			for i, task := range d.Tasks {
				for _, q := range task.Deps {
					need := at[q].End
					if d.Tasks[q].Unit != task.Unit {
						need += sync
					}
					require.GreaterOrEqual(t, at[i].Start, need, "trial %d %s: task %d before its dependency %d", trial, p.Name(), i, q)
				}
			}
			for u, order := range r.Order {
				for k := 1; k < len(order); k++ {
					require.GreaterOrEqual(t, at[order[k]].Start, at[order[k-1]].End, "unit %d runs two tasks at once", u)
				}
				if p == InOrder {
					require.True(t, slices.IsSorted(order), "in-order runs a unit's tasks in ID order")
				}
			}
			assert.GreaterOrEqual(t, r.Makespan, d.CriticalPath())
			var total time.Duration
			for u, w := range d.Work() {
				assert.GreaterOrEqual(t, r.Makespan, w)
				if slow == 1 {
					assert.Equal(t, w, r.Busy[u])
				}
				total += r.Busy[u]
			}
			assert.Equal(t, busy, total)
		}
	}
}

// mllmLike is mllm-NPU's prefill DAG: per chunk, alternating CPU (norm, attention) and NPU
// (linear) subgraphs per layer, attention reading every earlier chunk, with unequal costs: the
// NPU subgraphs cost about twice the CPU ones (Qwen1.5-1.8B at L=256: NPU 315 ms ≈ 2× CPU), and
// attention grows with the chunk index.
func mllmLike(chunks, layers int) (*DAG, error) {
	const cpu, npu = 0, 1
	return Chunked(2, chunks, func(i int) []Step {
		var st []Step
		for l := range layers {
			st = append(st,
				Step{Name: "norm+qkv_in", Layer: l, Parts: []Part{{Unit: cpu, Cost: 300 * time.Microsecond}}},
				Step{Name: "qkv", Layer: l, Parts: []Part{{Unit: npu, Cost: 1500 * time.Microsecond}}},
				Step{Name: "attn", Layer: l, CrossChunk: true, Parts: []Part{{Unit: cpu, Cost: time.Duration(600+400*i) * time.Microsecond}}},
				Step{Name: "o+ffn", Layer: l, Parts: []Part{{Unit: npu, Cost: 4 * ms}}},
				Step{Name: "ffn_norm", Layer: l, Parts: []Part{{Unit: cpu, Cost: 500 * time.Microsecond}}},
			)
		}
		return st
	})
}

func TestOutOfOrderBubbleBelowInOrder(t *testing.T) {
	d, err := mllmLike(4, 6)
	require.NoError(t, err)
	in, err := Simulate(d, InOrder)
	require.NoError(t, err)
	ooo, err := Simulate(d, OutOfOrder)
	require.NoError(t, err)
	t.Logf("%v\n%v", in, ooo)
	assert.Equal(t, 1, in.Busiest, "the NPU is the busiest unit")
	assert.Less(t, ooo.Bubble, in.Bubble)
	assert.Less(t, ooo.Makespan, in.Makespan)
}

func TestContributionIsThePaperRule(t *testing.T) {
	// cpu task c unlocks 5 ms of NPU work: +5 ms; npu task n unlocks 2 ms of CPU work: −2 ms
	d, _ := New(2)
	c := d.MustAdd(Task{Unit: 0, Cost: ms})
	n := d.MustAdd(Task{Unit: 1, Cost: ms})
	d.MustAdd(Task{Unit: 1, Cost: 5 * ms, Deps: []int{c}})
	d.MustAdd(Task{Unit: 0, Cost: 2 * ms, Deps: []int{n}})
	d.MustAdd(Task{Unit: 1, Cost: 9 * ms, Deps: []int{c, n}}) // needs both: unlocked by neither alone
	x, err := NewDispatcher(d, OutOfOrder)
	require.NoError(t, err)
	assert.Equal(t, 1, x.Bottleneck())
	assert.Equal(t, 5*ms, x.Contribution(c))
	assert.Equal(t, -2*ms, x.Contribution(n))
}

func TestDispatcherOnline(t *testing.T) {
	d, _ := New(2)
	a := d.MustAdd(Task{Unit: 0, Cost: ms})
	b := d.MustAdd(Task{Unit: 1, Cost: ms, Deps: []int{a}})
	x, err := NewDispatcher(d, FIFO)
	require.NoError(t, err)
	assert.Equal(t, -1, x.Next(1), "b is not ready")
	assert.Equal(t, -1, x.Next(7), "no such unit")
	_, err = x.Done(a)
	require.ErrorIs(t, err, ErrBadDAG, "a was not started")
	require.Equal(t, a, x.Next(0))
	rel, err := x.Done(a)
	require.NoError(t, err)
	assert.Equal(t, []int{b}, rel)
	_, err = x.Done(a)
	require.ErrorIs(t, err, ErrBadDAG, "twice")
	require.Equal(t, b, x.Next(1))
	_, err = x.Done(b)
	require.NoError(t, err)
	assert.True(t, x.Finished())
}

type idle struct{}

func (idle) Name() string                     { return "idle" }
func (idle) Pick(*Dispatcher, int, []int) int { return -1 }

func TestSimulateStalledPolicy(t *testing.T) {
	d, _ := New(1)
	d.MustAdd(Task{Cost: ms})
	_, err := Simulate(d, idle{})
	require.ErrorIs(t, err, ErrStalled)
}

func TestPolicyByName(t *testing.T) {
	for _, p := range Policies() {
		got, err := PolicyByName(p.Name())
		require.NoError(t, err)
		assert.Equal(t, p, got)
	}
	_, err := PolicyByName("nope")
	require.ErrorContains(t, err, "inorder, fifo, ooo")
}

func TestChunked(t *testing.T) {
	_, err := Chunked(2, 0, nil)
	require.ErrorIs(t, err, ErrBadDAG)
	n := 0
	_, err = Chunked(2, 2, func(int) []Step {
		n++
		return make([]Step, n)
	})
	require.ErrorIs(t, err, ErrBadDAG, "step counts differ")
	d, err := Chunked(2, 3, func(i int) []Step {
		return []Step{
			{Name: "a", Parts: []Part{{Unit: 0, Cost: ms}, {Unit: 1, Cost: 0, Name: "empty"}}},
			{Name: "b", CrossChunk: true, Parts: []Part{{Unit: 1, Cost: ms}}},
		}
	})
	require.NoError(t, err)
	require.Len(t, d.Tasks, 6, "zero-cost parts are dropped")
	last := d.Tasks[5]
	assert.Equal(t, "c2/b", last.Name)
	assert.ElementsMatch(t, []int{0, 2, 4}, last.Deps, "chunk 2's attention waits for every chunk's previous step")
}

// BenchmarkSimulate replays mllm-NPU's prefill DAG (32 chunks × 24 layers × 5 subgraphs, the
// cross-chunk attention edges) under each policy.
func BenchmarkSimulate(b *testing.B) {
	d, err := mllmLike(32, 24)
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range Policies() {
		b.Run(p.Name(), func(b *testing.B) {
			for b.Loop() {
				if _, err := Simulate(d, p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Processor sharing: a 10 ms and a 4 ms task on two units that run twice as slow together: both
// crawl until the short one ends at 8 ms, then the long one has 6 ms of work left alone.
func TestSimulateSlowdown(t *testing.T) {
	d, _ := New(2)
	a := d.MustAdd(Task{Unit: 0, Cost: 10 * ms})
	b := d.MustAdd(Task{Unit: 1, Cost: 4 * ms})
	d.MustAdd(Task{Unit: 1, Cost: 2 * ms, Deps: []int{a}})
	r, err := Simulate(d, FIFO, WithSlowdown(func(int) float64 { return 2 }))
	require.NoError(t, err)
	at := map[int]Slot{}
	for _, s := range r.Slots {
		at[s.Task] = s
	}
	assert.Equal(t, 8*ms, at[b].End)
	assert.Equal(t, 14*ms, at[a].End)
	assert.Equal(t, 16*ms, r.Makespan, "the last task runs alone")
	assert.Equal(t, []time.Duration{14 * ms, 10 * ms}, r.Busy)
	// a slowdown of 1 (or below) changes nothing
	plain, err := Simulate(d, FIFO)
	require.NoError(t, err)
	same, err := Simulate(d, FIFO, WithSlowdown(func(int) float64 { return 0.5 }))
	require.NoError(t, err)
	assert.Equal(t, plain.Slots, same.Slots)
	assert.Equal(t, 12*ms, plain.Makespan)
}
