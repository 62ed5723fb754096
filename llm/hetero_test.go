package llm

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/llm/synth"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/loader/plugintest"
	"github.com/xpuhub/xpu/sched"
)

// pluginDevices opens the named plugin backends (built by `make all`), skipping the test when
// one is missing, or failing it when XPU_REQUIRE_BACKENDS names that one.
func pluginDevices(t testing.TB, names ...string) []core.Device {
	t.Helper()
	var devs []core.Device
	for _, n := range names {
		b, err := loader.Open(context.Background(), n)
		if err != nil {
			required.Skip(t, n, "backend %s not available (run make all): %v", n, err)
		}
		t.Cleanup(func() { _ = b.Close() })
		devs = append(devs, b.Devices()...)
	}
	return devs
}

// synthModel writes a generated model to a file and maps it, like a real one.
func synthModel(t testing.TB, arch string, dt core.DType) *Model {
	t.Helper()
	s, err := synth.Preset(arch, "260K", dt, 11)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), arch+".gguf")
	require.NoError(t, synth.WriteFile(path, s))
	m, err := Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func mustPlan(t testing.TB, js string) *sched.Plan {
	t.Helper()
	p, err := sched.ParsePlan([]byte(js))
	require.NoError(t, err)
	return p
}

// heteroPlans are the plans of issue 11's Done-when list (those with decode shards:
// llm/shard's TestShardedPlansGiveTheSingleDeviceTokens).
func heteroPlans(t testing.TB) map[string]*sched.Plan {
	return map[string]*sched.Plan{
		"single unit": mustPlan(t, `{"units":["neon"],"prefill":{"rules":[{"unit":"neon"}]}}`),
		"neon+opencl by layers": mustPlan(t, `{"units":["neon","opencl"],"prefill":{"rules":[
			{"unit":"neon","layers":"0-2"},{"unit":"opencl"}]}}`),
		"neon+opencl+qnn, MATMULs on qnn": mustPlan(t, `{"units":["neon","opencl","qnn"],"prefill":{"rules":[
			{"unit":"qnn","ops":["MATMUL"]},{"unit":"opencl","ops":["ATTENTION","ROPE"]},{"unit":"neon"}]}}`),
		"prefill on opencl, decode on neon": mustPlan(t, `{"units":["opencl","neon"],
			"prefill":{"rules":[{"unit":"opencl"}]},"decode":{"rules":[{"unit":"neon"}]}}`),
		"two pinned neon units": mustPlan(t, `{"units":["neon{cpus=0,threads=1}","neon{cpus=1,threads=1}"],
			"prefill":{"rules":[{"unit":"0","layers":"0-1"},{"unit":"1"}]}}`),
		"MATMULs row-split over two pinned neon units": mustPlan(t, `{"units":["neon{cpus=0,threads=1}","neon{cpus=1,threads=1}"],
			"prefill":{"rules":[{"ops":["MATMUL"],"split":{"strategy":"rows","units":["0","1"],"ratio":[0.5,0.5]}},{"unit":"0"}]}}`),
		"MATMULs stealing rows in prefill (merged) and decode (in place), over two pinned neon units": mustPlan(t, `{"units":["neon{cpus=0,threads=1}","neon{cpus=1,threads=1}"],
			"prefill":{"rules":[{"ops":["MATMUL"],"split":{"strategy":"rows","units":["0","1"],"ratio":[0.5,0.5],"steal":true}},{"unit":"0"}]},
			"decode":{"rules":[{"ops":["MATMUL"],"split":{"strategy":"rows","units":["0","1"],"ratio":[0.5,0.5],"steal":true}},{"unit":"0"}]}}`),
		"MATMULs seq-split neon+opencl, rows in decode": mustPlan(t, `{"units":["neon","opencl"],
			"prefill":{"rules":[{"ops":["MATMUL"],"split":{"strategy":"seq","units":["opencl","neon"],"ratio":[0.6,0.4]}},{"unit":"neon"}]},
			"decode":{"rules":[{"ops":["MATMUL"],"split":{"strategy":"rows","units":["neon","opencl"],"ratio":[0.5,0.5]}},{"unit":"neon"}]}}`),
		"MATMULs multiseq 8 = 4 + 2 + 2, hybrid in the FFN": mustPlan(t, `{"units":["neon{cpus=0,threads=1}","neon{cpus=1,threads=1}"],
			"prefill":{"rules":[
				{"ops":["MATMUL"],"nodes":["ffn_*"],"split":{"strategy":"hybrid","units":["1","0"],"ratio":[0.5,0.5],"lengths":[4]}},
				{"ops":["MATMUL"],"split":{"strategy":"multiseq","units":["0","1"],"lengths":[4,2]}},{"unit":"1"}]}}`),
		"MATMULs multiseq on the emulated NPU (static 4-row graphs), remainders on neon": mustPlan(t, `{"units":["neon","qnn"],
			"prefill":{"rules":[{"ops":["MATMUL"],"split":{"strategy":"multiseq","units":["qnn","neon"],"lengths":[4]}},{"unit":"neon"}]}}`),
	}
}

// greedy prefills a multi-chunk prompt (chunks pipeline when the plan splits the model) and
// decodes n tokens greedily.
func greedy(t *testing.T, r *Runner, prompt string, n int) []int32 {
	res, err := r.Generate(context.Background(), prompt, WithMaxTokens(n))
	require.NoError(t, err)
	return res.Tokens
}

// TestPlansGiveTheSingleDeviceTokens: every plan gives the single-device run's greedy tokens,
// for stories260K and a generated Qwen2 model, and copies no byte between units.
func TestPlansGiveTheSingleDeviceTokens(t *testing.T) {
	devs := pluginDevices(t, "neon", "opencl", "qnn")
	models := map[string]*Model{"qwen2-synth-f32": synthModel(t, "qwen2", core.F32),
		"qwen2-synth-f16": synthModel(t, "qwen2", core.F16)}
	if _, err := os.Stat(filepath.Join(storiesDir(), "stories260K.gguf")); err == nil {
		models["stories260K"] = openStories(t)
	} else {
		t.Logf("stories260K absent (%s): only the synthetic model runs", storiesDir())
	}
	ctx := context.Background()
	for mname, m := range models {
		prompt := storyPrompt
		single, err := NewRunner(ctx, m, devs[0], WithChunkSize(8), WithContextLength(96))
		require.NoError(t, err)
		want := greedy(t, single, prompt, 20)
		require.NoError(t, single.Close())
		for pname, plan := range heteroPlans(t) {
			t.Run(mname+"/"+pname, func(t *testing.T) {
				r, err := NewPlannedRunner(ctx, m, devs, plan, WithChunkSize(8), WithContextLength(96))
				require.NoError(t, err)
				defer func() { require.NoError(t, r.Close()) }()
				assert.Equal(t, want, greedy(t, r, prompt, 20))
				rep := r.Report()
				assert.Zero(t, rep.CopyBytes, "every unit imports the arena: nothing is copied")
				for _, u := range rep.Units {
					assert.Positive(t, u.Tasks, "unit %s ran nothing", u.Unit)
				}
			})
		}
	}
}

// storiesDir is ../shared/models without skipping.
func storiesDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "shared", "models")
}

// TestQuantizedPlanLogits: a Q4_0 model split over units (MATMULs on opencl, ATTENTION on the
// emulated NPU, the rest on neon) stays within the conformance bound for the synthetic Qwen2
// model's logits (llmconform's 1e-3 NMSE) of the single-device run. (QNN refuses GGUF block
// formats, so quantized MATMULs cannot go there: TestBadPlansFailBeforeRunning.)
func TestQuantizedPlanLogits(t *testing.T) {
	devs := pluginDevices(t, "neon", "opencl", "qnn")
	m := synthModel(t, "qwen2", core.Q4_0)
	ctx := context.Background()
	ids := m.Tokenizer.Encode(storyPrompt, true)
	logits := func(r *Runner) []float32 {
		l, err := r.Prefill(ctx, ids)
		require.NoError(t, err)
		return l
	}
	single, err := NewRunner(ctx, m, devs[0], WithChunkSize(8), WithContextLength(96))
	require.NoError(t, err)
	want := logits(single)
	require.NoError(t, single.Close())
	plan := mustPlan(t, `{"units":["neon","opencl","qnn"],"prefill":{"rules":[
		{"unit":"opencl","ops":["MATMUL"]},{"unit":"qnn","ops":["ATTENTION"]},{"unit":"neon"}]}}`)
	r, err := NewPlannedRunner(ctx, m, devs, plan, WithChunkSize(8), WithContextLength(96))
	require.NoError(t, err)
	defer r.Close()
	got := logits(r)
	for _, u := range r.Report().Units {
		assert.Positive(t, u.Tasks, "unit %s ran nothing", u.Unit)
	}
	var num, den float64
	for i := range want {
		d := float64(got[i] - want[i])
		num, den = num+d*d, den+float64(want[i])*float64(want[i])
	}
	t.Logf("Q4_0 over neon+opencl+qnn: logits NMSE %.3g", num/den)
	assert.Less(t, num/den, 1e-3)
}

// TestDecodeCopiesNothing: a decode step on neon+opencl+qnn moves no byte between units: the
// KV cache, the activations and the inputs are arena spans every unit imports.
func TestDecodeCopiesNothing(t *testing.T) {
	devs := pluginDevices(t, "neon", "opencl", "qnn")
	m := synthModel(t, "qwen2", core.F32)
	specs, err := sched.ParseUnitList("neon,opencl,qnn")
	require.NoError(t, err)
	plan, err := DefaultPlan(m, devs, specs)
	require.NoError(t, err)
	r, err := NewPlannedRunner(context.Background(), m, devs, plan, WithContextLength(64))
	require.NoError(t, err)
	defer r.Close()
	_, err = r.Prefill(context.Background(), []int32{1, 5, 9})
	require.NoError(t, err)
	before := r.Report()
	_, err = r.Decode(context.Background(), 7)
	require.NoError(t, err)
	after := r.Report()
	assert.Equal(t, before.Runs+1, after.Runs)
	assert.Zero(t, after.CopyBytes-before.CopyBytes, "bytes copied by one decode step")
	busy := 0
	for i, u := range after.Units {
		if u.Tasks > before.Units[i].Tasks {
			busy++
		}
	}
	assert.Equal(t, 3, busy, "the default plan uses all three units in a decode step:\n%s", r.Placement())
}

// noImportDevice hides a device's import capabilities: the runtime must copy for it.
type noImportDevice struct{ core.Device }

func (d noImportDevice) Info() core.DeviceInfo {
	i := d.Device.Info()
	i.Caps &^= core.CapImportHost | core.CapImportFD
	return i
}

// TestUnitWithoutImportGetsCopies: a unit that can import nothing gets explicit copies,
// counted in the report, and the result is unchanged.
func TestUnitWithoutImportGetsCopies(t *testing.T) {
	m := openStories(t)
	b := ref.New()
	defer b.Close()
	dev := b.Devices()[0]
	ctx := context.Background()
	single, err := NewRunner(ctx, m, dev, WithChunkSize(8), WithContextLength(64))
	require.NoError(t, err)
	want := greedy(t, single, "Tom", 6)
	require.NoError(t, single.Close())

	r, err := NewRunner(ctx, m, noImportDevice{dev}, WithChunkSize(8), WithContextLength(64))
	require.NoError(t, err)
	defer r.Close()
	assert.Equal(t, want, greedy(t, r, "Tom", 6))
	rep := r.Report()
	assert.Equal(t, "copy", rep.Units[0].Import)
	assert.Positive(t, rep.CopyBytes)
	assert.Contains(t, rep.String(), "copies")
}

// TestTraceTracksEveryUnit: the trace of a run parses as Chrome trace-event JSON with one
// track per unit and partition slices that carry chunk and layer, and a requests track whose
// slices carry the bubble rate.
func TestTraceTracksEveryUnit(t *testing.T) {
	devs := pluginDevices(t, "neon", "opencl", "qnn")
	m := synthModel(t, "llama", core.F32)
	tr := sched.NewTrace()
	plan := heteroPlans(t)["neon+opencl+qnn, MATMULs on qnn"]
	r, err := NewPlannedRunner(context.Background(), m, devs, plan, WithChunkSize(4), WithContextLength(64), WithTrace(tr))
	require.NoError(t, err)
	greedy(t, r, "hello world, once upon a time", 4)
	require.NoError(t, r.Close())
	path := filepath.Join(t.TempDir(), "t.json")
	require.NoError(t, tr.WriteFile(path))
	events, err := sched.ReadTraceFile(path)
	require.NoError(t, err)
	tracks := map[string]bool{}
	slices := map[string]int{}
	waits, requests := 0, 0
	for _, e := range events {
		tracks[e.Track] = true
		if e.Ph != "X" {
			continue
		}
		if strings.HasPrefix(e.Name, "wait ") {
			waits++
			continue
		}
		if e.Track == "requests" {
			// one slice per request, with its bubble rate
			require.Contains(t, e.Args, "bubble_rate", "slice %s", e.Name)
			requests++
			continue
		}
		require.Contains(t, e.Args, "chunk", "slice %s", e.Name)
		require.Contains(t, e.Args, "layer", "slice %s", e.Name)
		slices[e.Track]++
	}
	for _, u := range []string{"neon:0", "opencl:0", "qnn:0"} {
		assert.Positive(t, slices[u], "no partition slices on %s (tracks %v)", u, tracks)
	}
	assert.Positive(t, waits, "cross-unit waits are slices of their own")
	assert.Positive(t, requests, "requests have a track of their own")
}

// TestBadPlansFailBeforeRunning: an unknown unit, a node no rule places and a refused op fail
// when the runner is made, naming node, unit and reason.
func TestBadPlansFailBeforeRunning(t *testing.T) {
	devs := pluginDevices(t, "neon", "qnn")
	m := synthModel(t, "llama", core.Q4_0)
	tests := []struct {
		name, plan string
		want       []string
		is         error
	}{
		{"unknown unit", `{"units":["neon","gpu:3"],"prefill":{"rules":[{"unit":"gpu:3"}]}}`,
			[]string{"gpu:3", "no device"}, core.ErrNotFound},
		{"unlisted unit", `{"units":["neon"],"prefill":{"rules":[{"unit":"qnn"}]}}`,
			[]string{"qnn:0", "not one of the plan's units"}, sched.ErrBadPlan},
		{"no rule", `{"units":["neon"],"prefill":{"rules":[{"unit":"neon","ops":["MATMUL"]}]}}`,
			[]string{"no plan rule", "embd"}, sched.ErrNoRule},
		{"refused op", `{"units":["neon","qnn"],"prefill":{"rules":[{"unit":"qnn","ops":["MATMUL"]},{"unit":"neon"}]}}`,
			[]string{"attn_q", "MATMUL", "qnn:0", "GGUF block format"}, sched.ErrPlanRefused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := sched.ParsePlan([]byte(tt.plan))
			if err == nil {
				var r *Runner
				r, err = NewPlannedRunner(context.Background(), m, devs, p, WithContextLength(32))
				if r != nil {
					r.Close()
				}
			}
			require.Error(t, err)
			require.ErrorIs(t, err, tt.is)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

// TestRunnerLeavesNoGoroutines: making, running and closing runners leaves no goroutine
// behind (the unit workers stop with the runner).
func TestRunnerLeavesNoGoroutines(t *testing.T) {
	devs := pluginDevices(t, "neon", "opencl")
	m := synthModel(t, "llama", core.F32)
	plan := mustPlan(t, `{"units":["neon","opencl"],"prefill":{"rules":[{"unit":"neon","ops":["MATMUL"]},{"unit":"opencl"}]}}`)
	run := func() {
		r, err := NewPlannedRunner(context.Background(), m, devs, plan, WithChunkSize(4), WithContextLength(32))
		require.NoError(t, err)
		greedy(t, r, "hello", 3)
		require.NoError(t, r.Close())
		require.NoError(t, r.Close(), "closing twice is a no-op")
		_, err = r.Decode(context.Background(), 5)
		require.ErrorIs(t, err, core.ErrBadState)
		assert.Len(t, r.Report().Units, 2, "the report stays readable")
	}
	run() // plugin threads and pools that live for the process start here
	before := runtime.NumGoroutine()
	for range 3 {
		run()
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), before, "goroutines left behind")
}

// isolatedTestPlugin opens loader/testdata's plugin (ADD, SUB, MUL, RELU, NEG, SCALE in F32) in
// a child process; it sees the arena through an fd.
func isolatedTestPlugin(t *testing.T, defines ...string) core.Backend {
	t.Helper()
	path := plugintest.Plugin(t, defines...)
	b, err := loader.Open(context.Background(), path, loader.Isolated(), loader.WithoutEnv())
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// residualsOn puts the residual ADDs (by node name) on the test plugin's unit, the rest on neon.
func residualsOn(t *testing.T, b core.Backend) *sched.Plan {
	name := b.Info().Name
	return mustPlan(t, `{"units":["neon","`+name+`"],"prefill":{"rules":[
		{"unit":"`+name+`","nodes":["attn_residual","ffn_residual"]},{"unit":"neon"}]}}`)
}

// TestIsolatedUnitInThePlan: a unit in a child process takes part in a plan through the arena
// (imported by fd: no copy) and the tokens do not change.
func TestIsolatedUnitInThePlan(t *testing.T) {
	devs := pluginDevices(t, "neon")
	b := isolatedTestPlugin(t)
	m := synthModel(t, "llama", core.F32)
	ctx := context.Background()
	single, err := NewRunner(ctx, m, devs[0], WithChunkSize(4), WithContextLength(48))
	require.NoError(t, err)
	want := greedy(t, single, "hello world, once upon a time", 8)
	require.NoError(t, single.Close())

	r, err := NewPlannedRunner(ctx, m, append(devs, b.Devices()...), residualsOn(t, b), WithChunkSize(4), WithContextLength(48))
	require.NoError(t, err)
	defer r.Close()
	assert.Equal(t, want, greedy(t, r, "hello world, once upon a time", 8))
	rep := r.Report()
	assert.Equal(t, "fd", rep.Units[1].Import)
	assert.Positive(t, rep.Units[1].Tasks)
	assert.Zero(t, rep.CopyBytes)
}

// TestCrashedUnitFailsTheRequest: a unit whose (isolated) backend crashes mid-run fails the
// request with core.ErrBackendCrashed; the runner closes without leaking goroutines, and after
// the backend restarts a runner can be made again.
func TestCrashedUnitFailsTheRequest(t *testing.T) {
	devs := pluginDevices(t, "neon")
	b := isolatedTestPlugin(t, "TP_FAULT=1")
	m := synthModel(t, "llama", core.F32)
	ctx := context.Background()
	all := append(devs, b.Devices()...)
	plan := residualsOn(t, b)
	before := runtime.NumGoroutine()
	r, err := NewPlannedRunner(ctx, m, all, plan, WithChunkSize(4), WithContextLength(48))
	require.NoError(t, err, "the plan is fine: the fault is in execution_run")
	_, err = r.Generate(ctx, "hello", WithMaxTokens(4))
	require.ErrorIs(t, err, core.ErrBackendCrashed)
	_, err = r.Decode(ctx, 5)
	require.ErrorIs(t, err, core.ErrBackendCrashed, "later requests fail fast")
	require.NoError(t, r.Close())
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), before, "goroutines left behind")

	require.NoError(t, b.(loader.Restarter).Restart(ctx))
	r, err = NewPlannedRunner(ctx, m, all, plan, WithChunkSize(4), WithContextLength(48))
	require.NoError(t, err, "the runner is rebuilt on the restarted backend")
	require.NoError(t, r.Close())
}

// TestRunnersShareARuntime: two sequences on one runtime run at the same time — one decodes on
// the first unit while the other prefills on the second — and each gives the tokens it gives
// alone.
func TestRunnersShareARuntime(t *testing.T) {
	devs := pluginDevices(t, "neon")
	m := synthModel(t, "llama", core.F32)
	ctx := context.Background()
	specs, err := sched.ParseUnitList("neon{cpus=0,threads=1},neon{cpus=1,threads=1}")
	require.NoError(t, err)
	tr := sched.NewTrace()
	rt, err := sched.NewRuntime(ctx, devs, specs, sched.WithRuntimeTrace(tr))
	require.NoError(t, err)
	defer func() { require.NoError(t, rt.Close()) }()
	plans := []*sched.Plan{
		mustPlan(t, `{"units":["neon{cpus=0,threads=1}"],"prefill":{"rules":[{"unit":"0"}]}}`),
		mustPlan(t, `{"units":["neon{cpus=0,threads=1}","neon{cpus=1,threads=1}"],
			"prefill":{"rules":[{"unit":"1"}]},"decode":{"rules":[{"unit":"0"}]}}`),
	}
	prompts := []string{"hello", "once upon a time there was a dog and a cat and a bird"}
	want := make([][]int32, 2)
	runners := make([]*Runner, 2)
	for i, p := range plans {
		r, err := NewPlannedRunner(ctx, m, devs, p, WithChunkSize(4), WithContextLength(64), WithRuntime(rt))
		require.NoError(t, err)
		runners[i] = r
		want[i] = greedy(t, r, prompts[i], 12)
	}
	got := make([][]int32, 2)
	errs := make([]error, 2)
	done := make(chan int)
	for i := range runners {
		go func() {
			res, err := runners[i].Generate(ctx, prompts[i], WithMaxTokens(12))
			got[i], errs[i] = res.Tokens, err
			done <- i
		}()
	}
	<-done
	<-done
	for i := range runners {
		require.NoError(t, errs[i])
		assert.Equal(t, want[i], got[i], "sequence %d", i)
		require.NoError(t, runners[i].Close())
	}
	_, err = runners[0].Decode(ctx, 3)
	assert.ErrorIs(t, err, core.ErrBadState)
	_, err = NewPlannedRunner(ctx, m, devs, mustPlan(t, `{"units":["neon"],"prefill":{"rules":[{"unit":"0"}]}}`),
		WithRuntime(rt))
	assert.ErrorIs(t, err, core.ErrNotFound, "a unit the runtime lacks")
}
