package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/synth"
	"github.com/xpuhub/xpu/sched"
	"github.com/xpuhub/xpu/sched/profile"
)

func TestPlanSoC(t *testing.T) {
	out := filepath.Join(t.TempDir(), "plan.json")
	code, stdout, stderr := runCLI(t, "plan", "--soc", "sd8gen3", "--model", "qwen1.5-1.8b", "-o", out)
	require.Equal(t, 0, code, stderr)
	for _, s := range []string{
		"SIMULATION (simulated:sd8gen3) of qwen1.5-1.8b", "PREDICTED",
		"prefill: 1024 tokens", "decode: one token",
		"cpu-only", "gpu-only", "npu-only", "layer-level", "tensor-level", "chunks in order",
		"plan written to " + out,
	} {
		assert.Contains(t, stdout, s)
	}
	assert.NotContains(t, stdout, "MEASURED")
	assert.NotContains(t, stdout, "against the papers", "published figures only with --papers")

	// --papers adds the published figures beside the simulation's predictions
	code, withPapers, stderr := runCLI(t, "plan", "--soc", "sd8gen3", "--model", "qwen1.5-1.8b", "--papers")
	require.Equal(t, 0, code, stderr)
	for _, s := range []string{"against the papers", "mllm-NPU Fig. 13a", "> 1000.0 tok/s"} {
		assert.Contains(t, withPapers, s)
	}
	code, _, stderr = runCLI(t, "plan", "--model", "x.gguf", "--papers")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--papers compares a simulated SoC")
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	f, err := sched.ParsePlan(b)
	require.NoError(t, err, "the runtime reads the solver's plan file")
	assert.Positive(t, f.Prefill.Chunk)
	assert.NotEmpty(t, f.Decode.Rules)

	// --steal and --adapt: the same plan, its rows splits over two units written as stealing
	// or adaptive ones
	for _, c := range []struct {
		flag, note string
		marked     func(*sched.Split) bool
	}{
		{"--steal", "rows splits and shards over two units steal (--steal)", func(s *sched.Split) bool { return s.Steal }},
		{"--adapt", "rows splits and shards over two units adapt (--adapt)", func(s *sched.Split) bool { return s.Adapt }},
	} {
		code, stdout, stderr = runCLI(t, "plan", "--soc", "sd8gen3", "--model", "qwen1.5-1.8b", c.flag, "-o", out)
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, stdout, c.note)
		b, err = os.ReadFile(out)
		require.NoError(t, err)
		f, err = sched.ParsePlan(b)
		require.NoError(t, err)
		var marked int
		for _, r := range append(f.Prefill.Rules, f.Decode.Rules...) {
			if r.Split != nil && c.marked(r.Split) {
				assert.Equal(t, sched.SplitRows, r.Split.Strategy)
				marked++
			}
		}
		assert.Positive(t, marked, "%s: %s", c.flag, b)
	}
	// not both
	code, _, stderr = runCLI(t, "plan", "--soc", "sd8gen3", "--model", "qwen1.5-1.8b", "--adapt", "--steal")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "usage: xpu plan")
}

func TestPlanUsage(t *testing.T) {
	runCLICases(t, nil, []cliCase{
		{args: []string{"plan"}, code: 2, says: "usage: xpu plan"},
		{args: []string{"plan", "--soc", "sd8gen3", "--model", "qwen1.5-1.8b", "--mode", "best"}, code: 2, says: "tensor, layer, split or single"},
		{args: []string{"plan", "--soc", "sd8gen3", "--model", "qwen1.5-1.8b", "--policy", "random"}, code: 2, says: "unknown policy"},
		{args: []string{"plan", "--soc", "nope", "--model", "qwen1.5-1.8b"}, code: 1, says: "sd8gen3"},
		{args: []string{"plan", "--soc", "sd8gen3", "--model", "gpt-5"}, code: 1, says: "qwen1.5-1.8b, llama-8b"},
		{args: []string{"plan", "--soc", "sd8gen3", "--model", "llama-8b", "--units", "gpu,dsp"}, code: 1, says: "not in the profile"},
		{args: []string{"plan", "--model", "x.gguf", "--profile", "/nonexistent.json"}, code: 1, says: "no such file"},
		{args: []string{"tune", "--profile"}, code: 2, says: "usage: xpu tune"},
		{args: []string{"tune", "--profile", "--energy", "--model", "x"}, code: 2, says: "usage: xpu tune"},
		{args: []string{"tune", "--profile", "--model", "x.gguf", "--grid", "1,0"}, code: 1, says: "--grid"},
	})
}

// xpu tune --profile measures a model on two units of the reference backend and stores the
// profile; xpu plan --model finds it in the cache and solves; a plan from the profile file
// gives the same placement.
func TestTuneProfileThenPlan(t *testing.T) {
	model := storiesPath(t)
	dir := t.TempDir()
	t.Setenv("XPU_CACHE_DIR", dir)
	file := filepath.Join(dir, "p.json")
	units := "ref,ref{threads=1}"
	code, stdout, stderr := runCLI(t, "tune", "--profile", "--model", model, "--units", units, "--grid", "1,8,32", "--min-time", "1ms", "-o", file)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "profiling stories260K.gguf")
	assert.Contains(t, stdout, "MATMUL")
	assert.Contains(t, stdout, "stored: ")
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	p, err := profile.Parse(b)
	require.NoError(t, err)
	assert.Equal(t, "measured", p.Source)
	require.Len(t, p.Units, 2)
	stored, err := filepath.Glob(filepath.Join(dir, "profiles", "*.json"))
	require.NoError(t, err)
	require.Len(t, stored, 1)

	// xpu plan finds the stored profile by the units and the model
	code, stdout, stderr = runCLI(t, "plan", "--model", model, "--units", units, "--prompt", "64")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "xpu plan: profile "+stored[0])
	assert.Contains(t, stdout, "MEASURED profile of stories260K.gguf")
	// other units: nothing stored
	code, _, stderr = runCLI(t, "plan", "--model", model, "--units", "ref{threads=2}")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "xpu tune --profile")

	out := filepath.Join(dir, "plan.json")
	code, stdout, stderr = runCLI(t, "plan", "--model", model, "--profile", file, "--prompt", "64", "--compare", "-o", out)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "MEASURED profile of stories260K.gguf")
	assert.Contains(t, stdout, "ref:0-only")
	assert.Contains(t, stdout, "best single unit")
	_, err = os.Stat(out)
	require.NoError(t, err)
}

// The README's `xpu plan` and `xpu tune --profile` lines, run as written (from the repository
// root, with the cache in a temporary directory and plan files written there).
func TestREADMEPlanCommands(t *testing.T) {
	lines := readmeLinesWhere(t, func(l string) bool {
		return strings.HasPrefix(l, "build/xpu plan ") || strings.HasPrefix(l, "build/xpu tune --profile ")
	})
	require.GreaterOrEqual(t, len(lines), 3)
	needsModel := false
	for _, l := range lines {
		needsModel = needsModel || strings.Contains(l, "../shared/models/")
	}
	if needsModel {
		storiesPath(t)
	}
	tmp := t.TempDir()
	for _, l := range lines {
		out, _ := runDocLine(t, l, []string{"XPU_CACHE_DIR=" + tmp}, "-o plan.json", "-o "+filepath.Join(tmp, "plan.json"))
		if strings.HasPrefix(l, "build/xpu plan ") {
			assert.Contains(t, out, "PREDICTED", l)
		} else {
			assert.Contains(t, out, "stored: ", l)
		}
	}
}

// A profile measured for another model is refused by xpu plan --profile, naming what differs,
// and so is a plan whose rules were written for another model (a layer or node this one lacks).
func TestPlanForAnotherModelRefused(t *testing.T) {
	model := storiesPath(t)
	dir := t.TempDir()
	t.Setenv("XPU_CACHE_DIR", dir)
	prof := filepath.Join(dir, "p.json")
	code, _, errOut := runCLI(t, "tune", "--profile", "--model", model, "--units", "ref", "--grid", "1,8", "--min-time", "1ms", "--no-cache", "-o", prof)
	require.Equal(t, 0, code, errOut)
	other := filepath.Join(dir, "other.gguf")
	require.NoError(t, synth.WriteFile(other, synth.Spec{Arch: "llama", Name: "other", Dim: 64, Layers: 2, Heads: 8, KVHeads: 4,
		FFN: 128, Vocab: 512, Context: 64, Type: core.F32, Seed: 1}))

	code, _, errOut = runCLI(t, "plan", "--model", model, "--profile", prof)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = runCLI(t, "plan", "--model", other, "--profile", prof)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "profile of another model: it was measured for stories260K.gguf (layers 5, not 2, ffn 172, not 128)")
	assert.Contains(t, errOut, "xpu tune --profile --model "+other)

	for _, tc := range []struct {
		name, rules, says string
	}{
		{"layers beyond the model", `{"unit":"0","layers":"3-9"},{"unit":"0"}`,
			`prefill rule 0 {"unit":"0","layers":"3-9"}: layer 9 is beyond the model's 5 layers (0-4)`},
		{"no such node", `{"unit":"0","nodes":["ffn_gatez"]},{"unit":"0"}`,
			`prefill rule 0 {"unit":"0","nodes":["ffn_gatez"]} matches no node of the model`},
		{"fits", `{"unit":"0","layers":"0-4","nodes":["ffn_*"]},{"unit":"0"}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := filepath.Join(t.TempDir(), "plan.json")
			require.NoError(t, os.WriteFile(plan, []byte(`{"units":["ref"],"prefill":{"rules":[`+tc.rules+`]}}`), 0o644))
			code, _, errOut := runCLI(t, "run", "--model", model, "-n", "1", "--plan", plan)
			if tc.says == "" {
				assert.Equal(t, 0, code, errOut)
				return
			}
			assert.Equal(t, 1, code)
			assert.Contains(t, errOut, tc.says)
		})
	}
}
