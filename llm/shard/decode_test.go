package shard

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/llmtest"
	"github.com/xpuhub/xpu/internal/modroot"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/quant"
	"github.com/xpuhub/xpu/llm/sample"
	"github.com/xpuhub/xpu/llm/synth"
	"github.com/xpuhub/xpu/sched"
)

const storyPrompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball."

// synthModel is a generated 260K model of arch with weights of dtype dt.
func synthModel(t testing.TB, arch string, dt core.DType) *llm.Model {
	t.Helper()
	s, err := synth.Preset(arch, "260K", dt, 11)
	require.NoError(t, err)
	return llmtest.Synth(t, s)
}

func mustPlan(t testing.TB, js string) *sched.Plan {
	t.Helper()
	p, err := sched.ParsePlan([]byte(js))
	require.NoError(t, err)
	return p
}

// made registers NewDecode wrapped so that it keeps the decode shards it makes last (a
// runner's, made after any DefaultPlan's), until t ends.
func made(t *testing.T) **decode {
	var d *decode
	llm.RegisterShards(func(m *llm.Model, ps *sched.PlanShards) (llm.ShardedDecode, error) {
		sd, err := NewDecode(m, ps)
		if err == nil {
			d = sd.(*decode)
		}
		return sd, err
	})
	t.Cleanup(func() { llm.RegisterShards(NewDecode) })
	return &d
}

// TestShardedDecodeLogits: a sharded decode step gives the logits of the unsharded one within
// the rounding of the sums cut into partial sums (or of another backend's kernels: opencl),
// for every step of a teacher-forced decode, on quantized and biased (Qwen2) models. Measured:
// 0 to 3e-13 NMSE for F32, F16 and Q8_0 weights, ~1e-7 for Q4_0 (four orders of magnitude
// under Q4_0's own error against F32 weights); the bound is 1e-6. With opencl, whose quantized
// MATMULs do not quantize the activation, quantized models differ by ~3e-4, under llmconform's
// 1e-3 (TestQuantizedPlanLogits' bound).
func TestShardedDecodeLogits(t *testing.T) {
	devs := llmtest.PluginDevices(t, "neon", "opencl")
	ctx := context.Background()
	plans := []struct {
		name  string
		plan  string
		bound float64
	}{
		{"two pinned neon units", `{"units":["neon{cpus=0,threads=1}","neon{cpus=1,threads=1}"],
			"prefill":{"rules":[{"unit":"0"}]},"decode":{"shards":{"units":["0","1"]},"rules":[{"unit":"0"}]}}`, 1e-6},
		{"stealing shards over two pinned neon units", `{"units":["neon{cpus=0,threads=1}","neon{cpus=1,threads=1}"],
			"prefill":{"rules":[{"unit":"0"}]},"decode":{"shards":{"units":["0","1"],"steal":true},"rules":[{"unit":"0"}]}}`, 1e-6},
		{"opencl and neon", `{"units":["neon","opencl"],"prefill":{"rules":[{"unit":"neon"}]},
			"decode":{"shards":{"units":["opencl","neon"]},"rules":[{"unit":"neon"}]}}`, 1e-3},
	}
	models := []struct {
		arch string
		dt   core.DType
	}{{"llama", core.Q4_0}, {"llama", core.Q8_0}, {"qwen2", core.F16}, {"qwen2", core.F32}}
	for _, mc := range models {
		m := synthModel(t, mc.arch, mc.dt)
		ids := m.Tokenizer.Encode(storyPrompt, true)
		single, err := llm.NewRunner(ctx, m, devs[0], llm.WithChunkSize(8), llm.WithContextLength(96))
		require.NoError(t, err)
		// the single unit's greedy continuation, and its logits at every step
		var want [][]float32
		var next []int32
		l, err := single.Prefill(ctx, ids)
		require.NoError(t, err)
		for range 12 {
			tok := sample.Argmax(l)
			next = append(next, tok)
			l, err = single.Decode(ctx, tok)
			require.NoError(t, err)
			want = append(want, l)
		}
		require.NoError(t, single.Close())
		for _, pc := range plans {
			t.Run(fmt.Sprintf("%s-%s/%s", mc.arch, mc.dt, pc.name), func(t *testing.T) {
				r, err := llm.NewPlannedRunner(ctx, m, devs, mustPlan(t, pc.plan), llm.WithChunkSize(8), llm.WithContextLength(96))
				require.NoError(t, err)
				defer func() { require.NoError(t, r.Close()) }()
				_, err = r.Prefill(ctx, ids)
				require.NoError(t, err)
				worst := 0.0
				for i, tok := range next {
					got, err := r.Decode(ctx, tok)
					require.NoError(t, err)
					e := quant.NMSE(got, want[i])
					worst = max(worst, e)
					assert.Less(t, e, pc.bound, "step %d", i)
				}
				t.Logf("worst logits NMSE over %d sharded steps: %.3g", len(next), worst)
				for _, u := range r.Report().Units {
					assert.Positive(t, u.Tasks, "unit %s ran nothing", u.Unit)
				}
			})
		}
	}
}

// TestShardsRefused: plans whose shards cannot run fail when the runner is made, with the
// reason, before anything runs.
func TestShardsRefused(t *testing.T) {
	devs := llmtest.PluginDevices(t, "neon")
	m := synthModel(t, "llama", core.Q4_0) // 4 KV heads, 192 neurons
	ctx := context.Background()
	units := `"units":["neon{cpus=0,threads=1}","neon{cpus=1,threads=1}"]`
	for _, tc := range []struct {
		name, plan string
		want       error
		msg        string
	}{
		{"prefill shards", `{` + units + `,"prefill":{"shards":{"units":["0","1"]},"rules":[{"unit":"0"}]}}`,
			sched.ErrBadPlan, "only decode steps are sharded"},
		{"one unit", `{` + units + `,"decode":{"shards":{"units":["0"]},"rules":[{"unit":"0"}]}}`,
			sched.ErrBadPlan, "1 units"},
		{"unit twice", `{` + units + `,"decode":{"shards":{"units":["0","0"]},"rules":[{"unit":"0"}]}}`,
			sched.ErrBadPlan, "listed twice"},
		{"ratio not summing to 1", `{` + units + `,"decode":{"shards":{"units":["0","1"],"ratio":[0.5,0.6]},"rules":[{"unit":"0"}]}}`,
			sched.ErrBadPlan, "sums to"},
		{"quantized columns not in whole blocks", `{` + units + `,"decode":{"shards":{"units":["0","1"],"ratio":[0.75,0.25]},"rules":[{"unit":"0"}]}}`,
			core.ErrUnsupported, "attn_output columns from 48 are not whole q4_0 blocks"},
		{"adaptive shards with no room to move", `{` + units + `,"decode":{"shards":{"units":["0","1"],"adapt":true},"rules":[{"unit":"0"}]}}`,
			core.ErrInvalidArgument, "leave no room"},
		{"adaptive shards over one unit", `{` + units + `,"decode":{"shards":{"units":["0"],"adapt":true},"rules":[{"unit":"0"}]}}`,
			sched.ErrBadPlan, "units"},
		{"adapt and steal together", `{` + units + `,"decode":{"shards":{"units":["0","1"],"adapt":true,"steal":true},"rules":[{"unit":"0"}]}}`,
			sched.ErrBadPlan, "adapt and steal together"},
		{"a shard with no KV head", `{` + units + `,"decode":{"shards":{"units":["0","1"],"ratio":[0.95,0.05]},"rules":[{"unit":"0"}]}}`,
			core.ErrInvalidArgument, "gets 0 of 4 KV heads"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := sched.ParsePlan([]byte(tc.plan))
			if err == nil {
				var r *llm.Runner
				r, err = llm.NewPlannedRunner(ctx, m, devs, p)
				if err == nil {
					_ = r.Close()
				}
			}
			require.Error(t, err)
			assert.True(t, errors.Is(err, tc.want), "%v", err)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

// TestAdaptiveShardsEveryCutGivesTheSameLogits: adaptive shards move FFN neurons between the
// units, but the partial sums are added in neuron order whichever unit ran them, so every cut
// gives the same bits, and the unsharded step's logits within TestShardedDecodeLogits' bound.
func TestAdaptiveShardsEveryCutGivesTheSameLogits(t *testing.T) {
	devs := llmtest.PluginDevices(t, "neon")
	s, err := synth.Preset("llama", "6M", core.Q4_0, 5) // 768 neurons: pieces of 32
	require.NoError(t, err)
	m := llmtest.Synth(t, s)
	ctx := context.Background()
	ids := m.Tokenizer.Encode(storyPrompt, true)
	single, err := llm.NewRunner(ctx, m, devs[0], llm.WithChunkSize(8), llm.WithContextLength(128))
	require.NoError(t, err)
	want, err := single.Prefill(ctx, ids)
	require.NoError(t, err)
	tok := sample.Argmax(want)
	want, err = single.Decode(ctx, tok)
	require.NoError(t, err)
	require.NoError(t, single.Close())

	d := made(t)
	r, err := llm.NewPlannedRunner(ctx, m, devs, mustPlan(t, `{"units":["neon{cpus=0,threads=1}","neon{cpus=1,threads=1}"],
		"prefill":{"rules":[{"unit":"0"}]},"decode":{"shards":{"units":["0","1"],"adapt":true},"rules":[{"unit":"0"}]}}`),
		llm.WithChunkSize(8), llm.WithContextLength(128))
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	a := *d
	require.NotNil(t, a)
	require.Len(t, a.cuts, 2*AdaptSteps+1)
	var first []float32
	for i, c := range a.cuts {
		t.Run(fmt.Sprintf("unit 0 runs %d neurons", Neurons(c.FFN[0])), func(t *testing.T) {
			if i > 0 {
				assert.Greater(t, Neurons(c.FFN[0]), Neurons(a.cuts[i-1].FFN[0]))
			}
			assert.Equal(t, int64(s.FFN), Neurons(c.FFN[0])+Neurons(c.FFN[1]))
			r.Reset()
			_, err := r.Prefill(ctx, ids)
			require.NoError(t, err)
			a.cur, a.since = i, -1<<30 // held: Observe never moves it, and the step runs cut i's program
			got, err := r.Decode(ctx, tok)
			require.NoError(t, err)
			assert.Equal(t, i, a.cur)
			if first == nil {
				first = got
			}
			assert.Equal(t, first, got, "bit for bit the first cut's logits")
			assert.Less(t, quant.NMSE(got, want), 1e-6)
		})
	}
}

// TestStealingShardsAreDeterministic: with stealing shards which unit runs which FFN piece
// depends on the timing, but the pieces are added in neuron order, so repeated runs of the
// same steps give the same bits.
func TestStealingShardsAreDeterministic(t *testing.T) {
	devs := llmtest.PluginDevices(t, "neon")
	m := synthModel(t, "llama", core.Q4_0)
	ctx := context.Background()
	ids := m.Tokenizer.Encode(storyPrompt, true)
	d := made(t)
	r, err := llm.NewPlannedRunner(ctx, m, devs, mustPlan(t, `{"units":["neon{cpus=0,threads=1}","neon{cpus=1,threads=1}"],
		"prefill":{"rules":[{"unit":"0"}]},"decode":{"shards":{"units":["0","1"],"steal":true},"rules":[{"unit":"0"}]}}`),
		llm.WithChunkSize(8), llm.WithContextLength(128))
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	require.NotNil(t, *d)
	require.Greater(t, len((*d).cuts[0].Shared), 2, "the FFN is cut into pieces")
	var first [][]float32
	for run := range 6 {
		r.Reset()
		l, err := r.Prefill(ctx, ids)
		require.NoError(t, err)
		var got [][]float32
		for range 4 {
			l, err = r.Decode(ctx, sample.Argmax(l))
			require.NoError(t, err)
			got = append(got, l)
		}
		if run == 0 {
			first = got
			continue
		}
		assert.Equal(t, first, got, "run %d", run)
	}
}

// TestDefaultPlanShardsDecode: the default plan shards decode steps over units of one kind
// where the model allows it, not over units of different kinds, and Without drops the
// shards (w8a8.Plan's own test checks it drops them too) (decode then follows the prefill's layer split again).
func TestDefaultPlanShardsDecode(t *testing.T) {
	devs := llmtest.PluginDevices(t, "neon", "opencl")
	m := synthModel(t, "llama", core.Q4_0)
	two, err := sched.ParseUnitList("neon{cpus=0,threads=1},neon{cpus=1,threads=1}")
	require.NoError(t, err)
	p, err := llm.DefaultPlan(m, devs, two)
	require.NoError(t, err)
	require.NotNil(t, p.Decode.Shards)
	assert.Equal(t, []string{"0", "1"}, p.Decode.Shards.Units)
	assert.NotEmpty(t, p.Prefill.Rules, "prefill keeps the layer split")
	q := Without(p)
	assert.Nil(t, q.Decode.Shards)
	assert.Empty(t, q.Decode.Rules, "decode as prefill")
	assert.NotNil(t, p.Decode.Shards, "the plan itself is left as it was")

	d := made(t)
	r, err := llm.NewPlannedRunner(context.Background(), m, devs, p, llm.WithChunkSize(8), llm.WithContextLength(96))
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	require.NotNil(t, *d, "decode steps are sharded")
	_, err = r.Generate(context.Background(), storyPrompt, llm.WithMaxTokens(4))
	require.NoError(t, err)

	mixed, err := sched.ParseUnitList("neon,opencl")
	require.NoError(t, err)
	p, err = llm.DefaultPlan(m, devs, mixed)
	require.NoError(t, err)
	if devs[0].Info().Kind != devs[len(devs)-1].Info().Kind {
		assert.Nil(t, p.Decode.Shards, "units of different kinds: no shards")
	}
	three, err := sched.ParseUnitList("neon{cpus=0,threads=1},neon{cpus=1,threads=1},neon{threads=1}")
	require.NoError(t, err)
	p, err = llm.DefaultPlan(m, devs, three)
	require.NoError(t, err)
	// 4 KV heads over 3 units: 1, 2 and 1, so a shard's output-projection columns start at 16,
	// not a whole Q4_0 block: the default plan leaves decode unsharded rather than fail
	assert.Nil(t, p.Decode.Shards)
}

// TestShardsNeedTheShardPackage: without a registered shard package the default plan does not
// shard decode steps, and a plan with decode shards fails, naming the package to import.
func TestShardsNeedTheShardPackage(t *testing.T) {
	m := synthModel(t, "llama", core.F32)
	devs := []core.Device{llmtest.RefDevice(t)}
	specs, err := sched.ParseUnitList("ref{unit=a},ref{unit=b}")
	require.NoError(t, err)
	p, err := llm.DefaultPlan(m, devs, specs)
	require.NoError(t, err)
	require.NotNil(t, p.Decode.Shards, "registered: decode is sharded")

	llm.RegisterShards(nil)
	t.Cleanup(func() { llm.RegisterShards(NewDecode) })
	q, err := llm.DefaultPlan(m, devs, specs)
	require.NoError(t, err)
	assert.Nil(t, q.Decode.Shards, "no shard package: decode as the layers run")
	_, err = llm.NewPlannedRunner(context.Background(), m, devs, p, llm.WithContextLength(32))
	require.ErrorIs(t, err, core.ErrUnsupported)
	assert.Contains(t, err.Error(), `import _ "github.com/xpuhub/xpu/llm/shard"`)
}

// TestColumnsRefusesBadRanges: a column range outside the weight, or a weight that is not a
// matrix, fails the graph instead of panicking.
func TestColumnsRefusesBadRanges(t *testing.T) {
	m := synthModel(t, "llama", core.F32)
	w, ok := m.Weight("blk.0.ffn_down.weight")
	require.True(t, ok)
	k := w.Shape[1]
	for _, tc := range []struct {
		name   string
		weight string
		k0, n  int64
		ok     bool
	}{
		{"whole", "blk.0.ffn_down.weight", 0, k, true},
		{"last half", "blk.0.ffn_down.weight", k / 2, k / 2, true},
		{"past the end", "blk.0.ffn_down.weight", k / 2, k, false},
		{"negative start", "blk.0.ffn_down.weight", -1, 2, false},
		{"empty", "blk.0.ffn_down.weight", 0, 0, false},
		{"a vector", "blk.0.ffn_norm.weight", 0, 1, false},
		{"no such weight", "blk.0.nothing.weight", 0, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := core.NewGraph()
			c := m.Columns(g, tc.weight, tc.k0, tc.n)
			if tc.ok {
				require.NoError(t, g.Err())
				assert.Equal(t, core.Shape{w.Shape[0], tc.n}, c.Shape)
				return
			}
			assert.Error(t, g.Err())
		})
	}
}

// TestQuantizedKVShardedDecode: decode shards write each shard's heads of a quantized cache
// row (whole blocks, as heads are) and read them back: the sharded steps' logits are the
// unsharded runner's.
func TestQuantizedKVShardedDecode(t *testing.T) {
	ctx := context.Background()
	m := llmtest.Synth(t, synth.Spec{Arch: "llama", Name: "kv32", Dim: 128, Layers: 3, Heads: 4, KVHeads: 2, FFN: 256,
		Vocab: 512, Context: 256, Type: core.F32, Seed: 5})
	devs := []core.Device{llmtest.RefDevice(t)}
	ids := []int32{1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49}
	// two contexts of the reference (it ignores the option that tells them apart)
	plan := mustPlan(t, `{"units":["ref{unit=a}","ref{unit=b}"],"prefill":{"rules":[{"unit":"0"}]},
		"decode":{"shards":{"units":["0","1"]},"rules":[{"unit":"0"}]}}`)
	for _, dt := range []core.DType{core.Q8_0, core.Q4_0} {
		t.Run(dt.String(), func(t *testing.T) {
			run := func(r *llm.Runner, err error) [][]float32 {
				require.NoError(t, err)
				defer r.Close()
				l, err := r.Prefill(ctx, ids)
				require.NoError(t, err)
				var out [][]float32
				for i := range 6 {
					l, err = r.Decode(ctx, int32(100+i))
					require.NoError(t, err)
					out = append(out, l)
				}
				return out
			}
			want := run(llm.NewRunner(ctx, m, devs[0], llm.WithKVCacheType(dt), llm.WithChunkSize(4), llm.WithContextLength(64)))
			d := made(t)
			pr, err := llm.NewPlannedRunner(ctx, m, devs, plan, llm.WithKVCacheType(dt), llm.WithChunkSize(4), llm.WithContextLength(64))
			require.NoError(t, err)
			require.NotNil(t, *d, "decode steps are sharded")
			got := run(pr, nil)
			for i := range want {
				assert.Less(t, quant.NMSE(got[i], want[i]), 1e-10, "step %d", i)
			}
		})
	}
}

// TestShardedPlansGiveTheSingleDeviceTokens: every plan with decode shards gives the
// single-device run's greedy tokens (llm's TestPlansGiveTheSingleDeviceTokens for the other
// plans), for stories260K and generated Qwen2 models, and copies no byte between units.
func TestShardedPlansGiveTheSingleDeviceTokens(t *testing.T) {
	devs := llmtest.PluginDevices(t, "neon", "opencl")
	plans := map[string]string{
		"decode sharded over two pinned neon units": `{"units":["neon{cpus=0,threads=1}","neon{cpus=1,threads=1}"],
			"prefill":{"rules":[{"unit":"0"}]},"decode":{"shards":{"units":["0","1"]},"rules":[{"unit":"0"}]}}`,
		"decode sharded, the FFN's pieces stolen, over two pinned neon units": `{"units":["neon{cpus=0,threads=1}","neon{cpus=1,threads=1}"],
			"prefill":{"rules":[{"unit":"0"}]},"decode":{"shards":{"units":["0","1"],"steal":true},"rules":[{"unit":"0"}]}}`,
		"decode sharded 3:1 over neon and opencl": `{"units":["neon","opencl"],
			"prefill":{"rules":[{"unit":"neon"}]},"decode":{"shards":{"units":["opencl","neon"],"ratio":[0.75,0.25]},"rules":[{"unit":"neon"}]}}`,
	}
	models := map[string]*llm.Model{"qwen2-synth-f32": synthModel(t, "qwen2", core.F32),
		"qwen2-synth-f16": synthModel(t, "qwen2", core.F16)}
	if m, err := llm.Open(filepath.Join(modroot.Find(), "..", "shared", "models", "stories260K.gguf")); err == nil {
		t.Cleanup(func() { _ = m.Close() })
		models["stories260K"] = m
	} else {
		t.Logf("stories260K absent (%v): only the synthetic models run", err)
	}
	ctx := context.Background()
	greedy := func(t *testing.T, r *llm.Runner) []int32 {
		res, err := r.Generate(ctx, storyPrompt, llm.WithMaxTokens(20))
		require.NoError(t, err)
		return res.Tokens
	}
	for mname, m := range models {
		single, err := llm.NewRunner(ctx, m, devs[0], llm.WithChunkSize(8), llm.WithContextLength(96))
		require.NoError(t, err)
		want := greedy(t, single)
		require.NoError(t, single.Close())
		for pname, plan := range plans {
			t.Run(mname+"/"+pname, func(t *testing.T) {
				r, err := llm.NewPlannedRunner(ctx, m, devs, mustPlan(t, plan), llm.WithChunkSize(8), llm.WithContextLength(96))
				require.NoError(t, err)
				defer func() { require.NoError(t, r.Close()) }()
				assert.Equal(t, want, greedy(t, r))
				rep := r.Report()
				assert.Zero(t, rep.CopyBytes, "every unit imports the arena: nothing is copied")
				for _, u := range rep.Units {
					assert.Positive(t, u.Tasks, "unit %s ran nothing", u.Unit)
				}
			})
		}
	}
}
