package solve

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
	"github.com/xpuhub/xpu/sched/dag"
	"github.com/xpuhub/xpu/sched/profile"
)

var tiny = profile.Model{Name: "tiny", Layers: 2, Dim: 256, FFN: 512, Heads: 4, KVHeads: 2, HeadDim: 64, Vocab: 1000, DType: "q8_0"}

// randomProfile is a random cost table over units units: every op class on a row grid with a
// random per-row cost and launch cost, some units with static row sizes and row alignment, some
// refusing an op class (unit 0 runs everything, so a plan exists), random sync costs and
// bandwidths.
func randomProfile(rng *rand.Rand, units int) *profile.Profile {
	p := &profile.Profile{Version: profile.Version, Source: "measured", Model: tiny,
		DefaultSyncSeconds: rng.Float64() * 200e-6}
	if rng.IntN(2) == 0 {
		p.CombinedGBs = 5 + rng.Float64()*50
	}
	grid := []int{1, 4, 16, 64, 256, 1024}
	kinds := []string{"cpu", "gpu", "npu"}
	for u := range units {
		un := profile.Unit{Name: fmt.Sprintf("u%d", u), Kind: kinds[rng.IntN(3)], LaunchSeconds: rng.Float64() * 50e-6,
			GBs: 5 + rng.Float64()*40}
		if rng.IntN(3) == 0 {
			un.StaticM = []int{1, 32, 64, 128, 256}
			un.RowAlign = 64
		}
		refuse := ""
		if u > 0 && rng.IntN(3) == 0 {
			refuse = []string{profile.OpAttention, profile.OpMatMul, profile.OpRope}[rng.IntN(3)]
		}
		perRow := map[string]float64{}
		add := func(op, dt string, k, n int) {
			if op == refuse {
				un.Entries = append(un.Entries, profile.Entry{Op: op, DType: dt, M: 1, K: k, N: n, Refused: "refused"})
				return
			}
			key := fmt.Sprint(op, k, n)
			if _, ok := perRow[key]; !ok {
				perRow[key] = (0.1 + rng.Float64()) * float64(max(k, 1)*n) * 1e-10
			}
			for _, m := range grid {
				t := un.LaunchSeconds + perRow[key]*float64(m)*(0.8+0.4*rng.Float64())
				un.Entries = append(un.Entries, profile.Entry{Op: op, DType: dt, M: m, K: k, N: n, Seconds: t})
			}
		}
		for _, mm := range tiny.DistinctMatMuls() {
			add(profile.OpMatMul, mm.DType, mm.K, mm.N)
		}
		for _, kv := range []int{64, 1024} {
			add(profile.OpAttention, "", kv, tiny.Heads*tiny.HeadDim)
		}
		// half the heads of a decode row cost half the attention (no draw: the seeds' other
		// tables stay as they were)
		for _, e := range slices.Clone(un.Entries) {
			if e.Op == profile.OpAttention && e.K == 1024 && e.M == 1 {
				h := profile.Entry{Op: profile.OpAttentionHeads, M: 1, K: 1024, N: e.N / 2, Refused: e.Refused}
				if e.Refused == "" {
					h.Seconds = un.LaunchSeconds + (e.Seconds-un.LaunchSeconds)/2
				}
				un.Entries = append(un.Entries, h)
			}
		}
		add(profile.OpNorm, "", 0, tiny.Dim)
		add(profile.OpRope, "", 0, (tiny.Heads+tiny.KVHeads)*tiny.HeadDim)
		add(profile.OpElementwise, "", 0, tiny.Dim)
		add(profile.OpElementwise, "", 0, tiny.FFN)
		if rng.IntN(3) == 0 {
			un.SharedSlowdown = 1 + 2*rng.Float64() // units sharing cores
		}
		p.Units = append(p.Units, un)
	}
	for a := range units {
		for b := range units {
			if a != b && rng.IntN(2) == 0 {
				p.Sync = append(p.Sync, profile.Sync{From: p.Units[a].Name, To: p.Units[b].Name, Seconds: rng.Float64() * 300e-6})
			}
		}
	}
	return p
}

// The solver's guarantee: over random cost tables, its plan is never predicted slower than the
// best single unit, for prefill and for decode, in either multi-unit mode (nor tensor-level
// slower than layer-level), and every op of the plan runs where the profile allows it.
func TestNeverSlowerThanBestSingleUnit(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for trial := range 25 {
		p := randomProfile(rng, 2+rng.IntN(2))
		require.NoError(t, p.Validate())
		prompt := []int{64, 100, 256}[rng.IntN(3)]
		bestPrefill, bestDecode := math.Inf(1), math.Inf(1)
		for _, u := range p.Units {
			pl, err := Solve(p, Options{Units: []string{u.Name}, Mode: Single, Prompt: prompt})
			if err != nil {
				require.ErrorIs(t, err, ErrNoPlan)
				continue
			}
			bestPrefill = min(bestPrefill, pl.Prefill.Time.Seconds())
			bestDecode = min(bestDecode, pl.Decode.Time.Seconds())
		}
		require.False(t, math.IsInf(bestPrefill, 1), "unit 0 runs everything")
		var layer *Plan
		for _, mode := range []Mode{Layer, Tensor} {
			pl, err := Solve(p, Options{Mode: mode, Prompt: prompt})
			require.NoError(t, err, "trial %d", trial)
			if mode == Layer {
				layer = pl
			} else {
				assert.LessOrEqual(t, pl.Prefill.Time, layer.Prefill.Time, "trial %d: tensor-level never slower than layer-level", trial)
				assert.LessOrEqual(t, pl.Decode.Time, layer.Decode.Time, "trial %d: decode", trial)
			}
			assert.LessOrEqual(t, pl.Prefill.Time.Seconds(), bestPrefill, "trial %d %v: prefill", trial, mode)
			assert.LessOrEqual(t, pl.Decode.Time.Seconds(), bestDecode, "trial %d %v: decode", trial, mode)
			assert.InDelta(t, bestPrefill, pl.SinglePrefill.Time.Seconds(), 1e-12)
			for _, op := range append(pl.Prefill.Layer, pl.Decode.Layer...) {
				if mode == Layer {
					assert.Equal(t, StrategySingle, op.Choice.Strategy)
				}
				for _, u := range op.Choice.Units {
					for _, e := range p.Units[u].Entries {
						assert.False(t, e.Op == op.Class && e.Refused != "", "trial %d: %s on refusing unit %s", trial, op.Op, p.Units[u].Name)
					}
				}
			}
		}
	}
}

// Splitting a MATMUL between two equal units halves it: the solver finds the rows cut and
// predicts it faster than either unit alone.
func TestSplitPaysBetweenEqualUnits(t *testing.T) {
	p := randomProfile(rand.New(rand.NewPCG(1, 1)), 1)
	p.DefaultSyncSeconds = 0
	p.CombinedGBs = 0
	twin := p.Units[0]
	twin.Name = "twin"
	twin.Entries = slices.Clone(twin.Entries)
	p.Units = append(p.Units, twin)
	pl, err := Solve(p, Options{Prompt: 256})
	require.NoError(t, err)
	split := 0
	for _, op := range pl.Prefill.Layer {
		if op.Class == profile.OpMatMul {
			if op.Choice.Strategy != StrategySingle {
				split++
				assert.Less(t, op.Time, op.BestSingleTime, op.Op)
			}
		}
	}
	assert.Positive(t, split)
	assert.Less(t, pl.Prefill.Time, pl.SinglePrefill.Time)
}

// A decode step's attention splits by KV heads between two equal units where the profile has
// their ATTENTION_HEADS times, and the plan file carries the split; without those times (a
// backend that cannot run a head range, a profile from before op set 4) it never does.
func TestHeadsSplitWhereProfiled(t *testing.T) {
	p := randomProfile(rand.New(rand.NewPCG(1, 1)), 1)
	p.DefaultSyncSeconds = 0
	p.CombinedGBs = 0
	for i, e := range p.Units[0].Entries {
		if e.Op == profile.OpAttention || e.Op == profile.OpAttentionHeads {
			p.Units[0].Entries[i].Seconds *= 100 // a long context: attention dominates the step
		}
	}
	twin := p.Units[0]
	twin.Name = "twin"
	twin.Kind = otherKind(twin.Kind) // over one kind the solver would shard the decode instead
	twin.Entries = slices.Clone(twin.Entries)
	p.Units = append(p.Units, twin)
	attn := func(pl *Plan) OpPlan {
		i := slices.IndexFunc(pl.Decode.Layer, func(op OpPlan) bool { return op.Class == profile.OpAttention })
		require.GreaterOrEqual(t, i, 0)
		return pl.Decode.Layer[i]
	}
	pl, err := Solve(p, Options{Prompt: 256, Context: 1024})
	require.NoError(t, err)
	op := attn(pl)
	require.Equal(t, StrategyHeads, op.Choice.Strategy, pl.Describe(op.Choice))
	assert.Less(t, op.Time, op.BestSingleTime)
	assert.Equal(t, "heads u0 50% + twin 50%", pl.Describe(op.Choice))
	for _, po := range pl.Prefill.Layer {
		assert.NotEqual(t, StrategyHeads, po.Choice.Strategy, "a prefill chunk's attention runs whole")
	}
	f := pl.File()
	i := slices.IndexFunc(f.Decode.Rules, func(r sched.Rule) bool { return r.Split != nil && r.Split.Strategy == sched.SplitHeads })
	require.GreaterOrEqual(t, i, 0, "the plan file splits the attention")
	assert.Equal(t, []string{"attn"}, f.Decode.Rules[i].Nodes)
	data, err := json.Marshal(f)
	require.NoError(t, err)
	_, err = sched.ParsePlan(data)
	require.NoError(t, err)

	for u := range p.Units {
		p.Units[u].Entries = slices.DeleteFunc(p.Units[u].Entries, func(e profile.Entry) bool { return e.Op == profile.OpAttentionHeads })
	}
	pl, err = Solve(p, Options{Prompt: 256, Context: 1024})
	require.NoError(t, err)
	assert.NotEqual(t, StrategyHeads, attn(pl).Choice.Strategy)
}

// readProfile parses a profile of testdata.
func readProfile(t *testing.T, name string) *profile.Profile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	p, err := profile.Parse(b)
	require.NoError(t, err)
	return p
}

// otherKind is a unit kind other than k.
func otherKind(k string) string {
	if k == "gpu" {
		return "cpu"
	}
	return "gpu"
}

// A sharded decode over two equal units of one kind is predicted faster than one unit and than
// the layer-level placements (no splits): each
// unit runs its KV heads' and FFN neurons' ops as one task between the residual adds, where a
// rows split meets after every MATMUL and runs RoPE and the activation on one unit. The plan
// file carries it as the decode's shards, which the runtime accepts. Over units of different
// kinds, or with a static-shape unit, the solver does not shard.
func TestShardedDecodeBetweenEqualUnits(t *testing.T) {
	// two equal units; edit changes the second
	twins := func(edit func(u *profile.Unit)) *profile.Profile {
		p := randomProfile(rand.New(rand.NewPCG(1, 1)), 1)
		p.DefaultSyncSeconds = 20e-6
		p.CombinedGBs = 0
		p.Units[0].StaticM = nil
		for i := range p.Units[0].Entries {
			p.Units[0].Entries[i].Seconds *= 100 // ops far longer than a launch or a sync: a large model
		}
		twin := p.Units[0]
		twin.Name = "twin"
		twin.Entries = slices.Clone(twin.Entries)
		edit(&twin)
		p.Units = append(p.Units, twin)
		return p
	}
	p := twins(func(*profile.Unit) {})
	pl, err := Solve(p, Options{Prompt: 256, Context: 1024})
	require.NoError(t, err)
	var sharded []string
	for _, op := range pl.Decode.Layer {
		if op.Choice.Strategy == StrategyShard {
			sharded = append(sharded, op.Op)
			assert.Equal(t, "shard u0 50% + twin 50%", pl.Describe(op.Choice))
		}
	}
	assert.Equal(t, []string{"attn_q", "attn_k", "attn_v", "rope", "attn", "attn_output", "ffn_gate", "ffn_up", "ffn_act", "ffn_down"}, sharded,
		"decode plan: %s", pl.Decode.Candidate)
	assert.Less(t, pl.Decode.Time, pl.SingleDecode.Time)
	for _, op := range pl.Prefill.Layer {
		assert.NotEqual(t, StrategyShard, op.Choice.Strategy, "prefill is never sharded")
	}
	// the best decode without shards is slower by the solver's own model
	noShards, err := Solve(p, Options{Prompt: 256, Context: 1024, Mode: Layer})
	require.NoError(t, err)
	assert.Less(t, pl.Decode.Time, noShards.Decode.Time)

	f := pl.File()
	require.NotNil(t, f.Decode.Shards)
	assert.Equal(t, []string{"u0", "twin"}, f.Decode.Shards.Units)
	assert.Equal(t, []float64{0.5, 0.5}, f.Decode.Shards.Ratio)
	assert.Nil(t, f.Prefill.Shards)
	for _, r := range f.Decode.Rules {
		for _, n := range r.Nodes {
			assert.NotContains(t, []string{"attn_q", "attn", "ffn_down"}, n, "a sharded op has no rule")
		}
	}
	rp, err := sched.ParsePlan(f.JSON())
	require.NoError(t, err)
	require.NotNil(t, rp.Decode.Shards)
	assert.False(t, rp.Decode.Shards.Steal)

	steal, err := Solve(p, Options{Prompt: 256, Context: 1024, Steal: true})
	require.NoError(t, err)
	require.NotNil(t, steal.File().Decode.Shards)
	assert.True(t, steal.File().Decode.Shards.Steal)

	for _, tc := range []struct {
		name string
		edit func(u *profile.Unit)
	}{
		{"another kind", func(u *profile.Unit) { u.Kind = otherKind(u.Kind) }},
		{"static shapes", func(u *profile.Unit) { u.StaticM = []int{1, 32, 64} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl, err := Solve(twins(tc.edit), Options{Prompt: 256, Context: 1024})
			require.NoError(t, err)
			for _, op := range pl.Decode.Layer {
				assert.NotEqual(t, StrategyShard, op.Choice.Strategy, op.Op)
			}
			assert.Nil(t, pl.File().Decode.Shards)
		})
	}
}

func TestStaticUnitStrategies(t *testing.T) {
	// a static-shape unit fast at MATMUL and a dynamic one: a 300-row prompt in one chunk
	// (300 is no static size) makes multiseq / hybrid / seq cuts worth it
	p := randomProfile(rand.New(rand.NewPCG(3, 3)), 2)
	p.DefaultSyncSeconds, p.Sync, p.CombinedGBs = 0, nil, 0
	p.Units[0].StaticM, p.Units[0].RowAlign = nil, 0
	p.Units[1].StaticM, p.Units[1].RowAlign = []int{1, 32, 64, 128, 256}, 64
	p.Units[1].Entries = nil
	for _, e := range p.Units[0].Entries {
		if e.Refused != "" {
			continue
		}
		if e.Op == profile.OpMatMul {
			e.Seconds /= 2
		}
		p.Units[1].Entries = append(p.Units[1].Entries, e)
	}
	pl, err := Solve(p, Options{Prompt: 300, Chunks: []int{300}})
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, op := range pl.Prefill.Layer {
		seen[op.Choice.Strategy] = true
		if op.Choice.Strategy == StrategyMultiSeq || op.Choice.Strategy == StrategyHybrid {
			assert.Equal(t, 1, op.Choice.Units[0], "the static unit first")
			std, rest := sched.DecomposeSeq(300, op.Choice.Lengths)
			assert.Positive(t, rest)
			assert.NotEmpty(t, std)
		}
	}
	assert.True(t, seen[StrategyMultiSeq] || seen[StrategyHybrid], "%v", seen)
}

func TestPlanFile(t *testing.T) {
	p := randomProfile(rand.New(rand.NewPCG(5, 6)), 3)
	pl, err := Solve(p, Options{Prompt: 256})
	require.NoError(t, err)
	f := pl.File()
	back, err := sched.ParsePlan(f.JSON())
	require.NoError(t, err, "%s", f.JSON())
	assert.Equal(t, f, back)
	assert.Equal(t, pl.Prefill.Rows, f.Prefill.Chunk)
	for _, ph := range []sched.PhasePlan{f.Prefill, f.Decode} {
		require.NotEmpty(t, ph.Rules)
		last := ph.Rules[len(ph.Rules)-1]
		assert.Empty(t, last.Nodes, "the last rule places the rest")
		named := map[string]bool{}
		for _, r := range ph.Rules {
			assert.Contains(t, f.Units, r.Unit)
			for _, n := range r.Nodes {
				named[n] = true
			}
			if r.Split != nil {
				for _, u := range r.Split.Units {
					assert.Contains(t, f.Units, u)
				}
				if r.Split.Strategy != sched.SplitMultiSeq {
					sum := 0.0
					for _, x := range r.Split.Ratio {
						sum += x
					}
					assert.InDelta(t, 1, sum, 1e-9)
				} else {
					assert.Empty(t, r.Split.Ratio)
					assert.NotEmpty(t, r.Split.Lengths)
				}
			}
		}
		for _, n := range []string{"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "attn", "q_rope", "logits"} {
			assert.True(t, named[n], n)
		}
	}
}

// TestPlanFileDynamicSplits: with Options.Steal (or Adapt) the rows splits over two units,
// and only they, are written as stealing (or adaptive) ones, and the runtime's parser takes
// the file.
func TestPlanFileDynamicSplits(t *testing.T) {
	cases := []struct {
		name string
		o    Options
		flag func(*sched.Split) bool
		word string
	}{
		{"steal", Options{Prompt: 256, Steal: true}, func(s *sched.Split) bool { return s.Steal }, ", stealing"},
		{"adapt", Options{Prompt: 256, Adapt: true}, func(s *sched.Split) bool { return s.Adapt }, ", adaptive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := randomProfile(rand.New(rand.NewPCG(5, 6)), 2)
			pl, err := Solve(p, c.o)
			require.NoError(t, err)
			f := pl.File()
			_, err = sched.ParsePlan(f.JSON())
			require.NoError(t, err, "%s", f.JSON())
			marked := 0
			for _, ph := range []sched.PhasePlan{f.Prefill, f.Decode} {
				for _, r := range ph.Rules {
					if r.Split == nil {
						continue
					}
					want := r.Split.Strategy == sched.SplitRows && len(r.Split.Units) == 2
					assert.Equal(t, want, c.flag(r.Split), "%s %v", r.Split.Strategy, r.Nodes)
					assert.False(t, r.Split.Steal && r.Split.Adapt, "never both")
					if want {
						marked++
					}
				}
			}
			assert.Positive(t, marked, "the profile gives rows splits: %s", f.JSON())
			two := Choice{Strategy: StrategyRows, Units: []int{0, 1}, Ratio: []float64{0.5, 0.5}}
			assert.Equal(t, "rows u0 50% + u1 50%"+c.word, pl.Describe(two))
			assert.Equal(t, "seq u0 50% + u1 50%", pl.Describe(Choice{Strategy: StrategySeq, Units: []int{0, 1}, Ratio: []float64{0.5, 0.5}}))
			pl.Steal, pl.Adapt = false, false
			assert.Equal(t, "rows u0 50% + u1 50%", pl.Describe(two))
			for _, ph := range []sched.PhasePlan{pl.File().Prefill, pl.File().Decode} {
				for _, r := range ph.Rules {
					if r.Split != nil {
						assert.False(t, r.Split.Steal || r.Split.Adapt, "static without the option")
					}
				}
			}
		})
	}
}

func TestSolveErrors(t *testing.T) {
	_, err := Solve(nil, Options{})
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	p := randomProfile(rand.New(rand.NewPCG(1, 2)), 2)
	_, err = Solve(p, Options{Units: []string{"nope"}})
	require.ErrorIs(t, err, core.ErrNotFound)
	require.ErrorContains(t, err, "u0, u1")
	_, err = Solve(p, Options{Chunks: []int{0}})
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	_, err = Solve(p, Options{Prompt: 1 << 20, Chunks: []int{32}})
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	require.ErrorContains(t, err, "over 256 chunks")
	// a unit that refuses MATMUL alone has no plan
	for i := range p.Units[1].Entries {
		if p.Units[1].Entries[i].Op == profile.OpMatMul {
			p.Units[1].Entries[i].Refused = "no"
			p.Units[1].Entries[i].Seconds = 0
		}
	}
	_, err = Solve(p, Options{Units: []string{"u1"}, Mode: Single})
	require.ErrorIs(t, err, ErrNoPlan)
	bad := randomProfile(rand.New(rand.NewPCG(1, 2)), 2)
	bad.Version = 9
	_, err = Solve(bad, Options{})
	require.ErrorIs(t, err, profile.ErrBadProfile)
}

func TestCompareAndReplay(t *testing.T) {
	p := randomProfile(rand.New(rand.NewPCG(9, 9)), 2)
	rows, plan, err := Compare(p, Options{Prompt: 256})
	require.NoError(t, err)
	var configs []string
	for _, r := range rows {
		configs = append(configs, r.Config)
	}
	assert.Equal(t, []string{"u0-only", "u1-only", "layer split", "layer split, chunks in order", "layer-level", "layer-level, chunks in order",
		"tensor-level", "tensor-level, chunks in order"}, configs)
	assert.Equal(t, Tensor, plan.Mode)
	in, err := Replay(p, plan, dag.InOrder)
	require.NoError(t, err)
	ooo, err := Replay(p, plan, dag.OutOfOrder)
	require.NoError(t, err)
	assert.Equal(t, plan.Prefill.Time, ooo.Makespan, "the plan's prediction is the out-of-order replay")
	assert.Positive(t, in.Makespan)
	bad := *plan
	bad.Prefill.Layer = append([]OpPlan{}, plan.Prefill.Layer...)
	bad.Prefill.Layer[0].Choice = Choice{Strategy: StrategySingle, Units: []int{7}}
	_, err = Replay(p, &bad, dag.InOrder)
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	bad.Prefill.Layer[0].Choice = Choice{Strategy: StrategyRows, Units: []int{0, 1}}
	_, err = Replay(p, &bad, dag.InOrder)
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.Contains(t, plan.Describe(Choice{Strategy: StrategyRows, Units: []int{0, 1}, Ratio: []float64{0.75, 0.25}}), "rows u0 75% + u1 25%")
}

// TestMeasuredNeonPairPrefersLayerSplit solves the 1B Q4_0 prefill over this machine's two
// pinned single-thread neon units from their measured profile (testdata, `xpu tune --profile`
// 2026-11-23, load 6–7). Measured on that machine (lab/notes/2026-11-23-profiler-and-solver-xpu-tune-profile-xpu.md): the
// layer split (layers 0–7 on one unit, 8–15 on the other, chunks pipelined) ran the 578-token
// prefill 1.2–1.8× faster than one unit (1.7× on a quiet machine), the per-op placement with
// every MATMUL row-split across the two 0.54×. The solver must choose the layer split and
// predict it faster than one unit.
func TestMeasuredNeonPairPrefersLayerSplit(t *testing.T) {
	p := readProfile(t, "neon2-1b-q4_0.json")
	pl, err := Solve(p, Options{Prompt: 578})
	require.NoError(t, err)
	require.NotNil(t, pl.Prefill.LayerUnits, "prefill plan: %s", pl.Prefill.Candidate)
	assert.Equal(t, []int{0, 1}, slices.Compact(slices.Clone(pl.Prefill.LayerUnits)), "contiguous ranges over both units")
	ratio := pl.Prefill.TokPerSec / pl.SinglePrefill.TokPerSec
	assert.Greater(t, ratio, 1.1, "predicted layer split over the best single unit")
	// the plan file splits the layers by range, nothing else
	f := pl.File()
	require.Len(t, f.Prefill.Rules, 2)
	assert.Equal(t, "0-"+strconv.Itoa(slices.Index(pl.Prefill.LayerUnits, 1)-1), f.Prefill.Rules[0].Layers)
	assert.True(t, strings.HasSuffix(f.Prefill.Rules[1].Layers, "-"))
	_, err = sched.ParsePlan(f.JSON())
	require.NoError(t, err)
}

// On a profile of two pinned neon units measured with ATTENTION_HEADS times and cold decode
// MATMULs (xpu tune --profile, 2026-11-28, the 1B Q4_0 of gen-model), the solver shards decode
// in equal shares and writes the shards into the plan file. (Run with such a plan, the 1B
// decoded at 32.4-37.1 tok/s against 28.8-31.9 with the rows splits the solver chose before
// shards were a candidate: lab/notes/2026-11-23-tensor-partitioning.md.)
func TestMeasuredNeonPairShardsDecode(t *testing.T) {
	p := readProfile(t, "neon2-1b-q4_0-shards.json")
	pl, err := Solve(p, Options{Prompt: 64})
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(pl.Decode.Candidate, "sharded:"), pl.Decode.Candidate)
	assert.Less(t, pl.Decode.Time, pl.SingleDecode.Time)
	sh := pl.File().Decode.Shards
	require.NotNil(t, sh)
	assert.Equal(t, []float64{0.5, 0.5}, sh.Ratio)
	assert.Len(t, sh.Units, 2)
}

// TestRuntimeTasks checks that a replay has the runtime's tasks (sched.Program): one per stage
// and chunk on one unit (a stage runs from a layer's attention to the next layer's RoPE), the
// stage at a layer split's boundary cut in two, and a row-split MATMUL of several rows a merge
// task on its first unit; chunks wait for their lane (one lane on one unit, two across units).
func TestRuntimeTasks(t *testing.T) {
	p := readProfile(t, "neon2-1b-q4_0.json")
	s := &solver{p: p, o: Options{Prompt: 256, Context: 256, Policy: dag.InOrder}, units: []int{0, 1}, memo: map[memoKey]cost{}}
	s.layer, s.head = layerOps(p.Model)
	L := p.Model.Layers
	single := candidate{stages: slices.Repeat([]int{1}, L)}
	split := candidate{stages: append(slices.Repeat([]int{0}, L/2), slices.Repeat([]int{1}, L-L/2)...)}
	for _, tc := range []struct {
		name     string
		c        candidate
		perChunk int
	}{
		{"one unit", single, L + 1},
		{"layer split", split, L + 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := s.build("prefill", tc.c, 64, 4)
			require.NoError(t, err)
			require.Len(t, d.Tasks, 4*tc.perChunk)
			// the first task of chunk 2 waits for chunk 1 (one lane) or chunk 0 (two lanes)
			first := d.Tasks[2*tc.perChunk]
			require.Len(t, first.Deps, 1)
			lanes := 1
			if tc.c.mask() != 1<<1 {
				lanes = 2
			}
			assert.Equal(t, d.Tasks[first.Deps[0]].Chunk, 2-lanes)
			serial, err := s.serialTime("prefill", tc.c, 64, 4)
			require.NoError(t, err)
			var sum time.Duration
			for _, task := range d.Tasks {
				sum += task.Cost
			}
			assert.Equal(t, serial, sum)
		})
	}
	// every MATMUL row-split: each split op's parts and a merge; Q, K, V (and gate, up) share
	rows := Choice{Strategy: StrategyRows, Units: []int{0, 1}, Ratio: []float64{0.5, 0.5}}
	c := candidate{}
	for _, op := range s.layer {
		ch := Choice{Strategy: StrategySingle, Units: []int{0}}
		if op.matmul {
			ch = rows
		}
		c.layer = append(c.layer, ch)
	}
	c.head = []Choice{{Strategy: StrategySingle, Units: []int{0}}, rows}
	steps, err := s.chunkSteps("prefill", c, 0, 64)
	require.NoError(t, err)
	var names []string
	for _, st := range steps[:8] {
		names = append(names, st.Name)
	}
	assert.Equal(t, []string{"blk.0.attn_norm", "blk.0.attn_q", "blk.0.attn_q.merge", "blk.0.attn", "blk.0.attn_output",
		"blk.0.attn_output.merge", "blk.0.ffn_gate", "blk.0.ffn_gate.merge"}, names)
	assert.Len(t, steps[1].Parts, 2, "Q, K and V parts: one task per unit")
}
