package soc

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched/dag"
	"github.com/xpuhub/xpu/sched/profile"
	"github.com/xpuhub/xpu/sched/solve"
)

func TestLoadSD8Gen3(t *testing.T) {
	assert.Contains(t, Names(), "sd8gen3")
	assert.Equal(t, []string{"sd8gen3"}, PlanNames(), "kirin9000 describes only its CPU")
	s, err := Load("sd8gen3")
	require.NoError(t, err)
	cpu := s.Units[s.unitIndex("cpu")]
	// 1 X4 + 3 A720 + 2 A720 of the cpu section of socs/sd8gen3.json at 95 % of their maximum
	assert.InDelta(t, 0.95*(130*3.3024+3*100*3.1488+2*100*2.9568)/1000, cpu.TFLOPS["int8"], 1e-9)
	assert.Equal(t, "int8", cpu.Precision("q4_0"), "llama.cpp's CPU kernels run quantized weights on int8 dot products")
	npu := s.Units[s.unitIndex("npu")]
	assert.Equal(t, "int8", npu.Precision("q8_0"), "W8A8")
	assert.Equal(t, "f16", npu.Precision("q4_0"), "W4A16")
	_, err = Load("nope")
	require.ErrorIs(t, err, ErrUnknown)
	require.ErrorContains(t, err, "sd8gen3")
}

// Every figure of a description needs a source: taking one away fails the parse.
func TestParseNeedsSources(t *testing.T) {
	b, err := socFiles.ReadFile("socs/sd8gen3.json")
	require.NoError(t, err)
	mutate := func(f func(m map[string]any)) []byte {
		var m map[string]any
		require.NoError(t, json.Unmarshal(b, &m))
		f(m)
		out, err := json.Marshal(m)
		require.NoError(t, err)
		return out
	}
	unit := func(m map[string]any, i int) map[string]any { return m["units"].([]any)[i].(map[string]any) }
	for _, tc := range []struct {
		name string
		f    func(m map[string]any)
	}{
		{"top-level source", func(m map[string]any) { delete(m["sources"].(map[string]any), "combined_gbs") }},
		{"unit source", func(m map[string]any) { delete(unit(m, 2)["sources"].(map[string]any), "m_half") }},
		{"rate source", func(m map[string]any) { delete(unit(m, 1)["sources"].(map[string]any), "tflops.f16") }},
		{"sync source", func(m map[string]any) { m["sync"].([]any)[0].(map[string]any)["source"] = "" }},
		{"paper source", func(m map[string]any) { m["paper"].([]any)[0].(map[string]any)["source"] = "" }},
		{"unknown field", func(m map[string]any) { m["fudge"] = 1 }},
		{"combined above peak", func(m map[string]any) { m["combined_gbs"] = 99 }},
		{"bad precision", func(m map[string]any) { unit(m, 1)["tflops"] = map[string]any{"f8": 1} }},
		{"paper unit", func(m map[string]any) {
			m["paper"].([]any)[0].(map[string]any)["setup"].(map[string]any)["units"] = []any{"dsp"}
		}},
		{"paper metric", func(m map[string]any) { m["paper"].([]any)[0].(map[string]any)["metric"] = "vibes" }},
		{"cpu source", func(m map[string]any) { delete(m["cpu"].(map[string]any)["sources"].(map[string]any), "gbs") }},
		{"cpu clusters", func(m map[string]any) { m["cpu"].(map[string]any)["clusters"] = []any{} }},
		{"cpu core count", func(m map[string]any) {
			m["cpu"].(map[string]any)["clusters"].([]any)[0].(map[string]any)["cores"] = 0
		}},
		{"from_cpu without cpu", func(m map[string]any) { delete(m, "cpu") }},
		{"from_cpu with its own bandwidth", func(m map[string]any) { unit(m, 0)["gbs"] = 40 }},
		{"neither units nor cpu", func(m map[string]any) {
			delete(m, "cpu")
			m["units"] = []any{}
			m["paper"] = []any{}
			m["sync"] = []any{}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(mutate(tc.f))
			require.ErrorIs(t, err, ErrBad)
			require.ErrorIs(t, err, core.ErrInvalidArgument)
		})
	}
}

// TestOneCPUDescription: the CPU unit's rate and bandwidth are the cpu section's, and a
// description of the CPU alone loads but cannot be planned for.
func TestOneCPUDescription(t *testing.T) {
	s, err := Load("sd8gen3")
	require.NoError(t, err)
	require.NotNil(t, s.CPU)
	cpu := s.Units[s.unitIndex("cpu")]
	assert.Equal(t, s.CPU.GBs, cpu.GBs)
	assert.Equal(t, s.CPU.Int8TOPS(), cpu.TFLOPS["int8"])
	assert.Less(t, s.CPU.GBs, s.DRAMGBs, "the CPU cores alone stay below the DRAM peak")

	k, err := Load("kirin9000")
	require.NoError(t, err)
	require.NotNil(t, k.CPU)
	assert.Empty(t, k.Units)
	m, err := Model("qwen1.5-1.8b")
	require.NoError(t, err)
	_, err = k.Profile(m)
	require.ErrorIs(t, err, ErrNoUnits)
	require.ErrorIs(t, err, core.ErrInvalidArgument)
}

func TestUnitModel(t *testing.T) {
	s, err := Load("sd8gen3")
	require.NoError(t, err)
	npu, gpu := s.Units[s.unitIndex("npu")], s.Units[s.unitIndex("gpu")]
	mm := func(m, k, n int) profile.Query {
		return profile.Query{Op: profile.OpMatMul, DType: "q4_0", M: m, K: k, N: n}
	}
	// NPU-①: rows below the tile cost what the tile costs
	assert.Equal(t, npu.Seconds(mm(17, 4096, 4096)), npu.Seconds(mm(32, 4096, 4096)))
	// the matrix unit fills up: per row, 1024 rows are cheaper than 256
	assert.Less(t, npu.Seconds(mm(1024, 4096, 4096))/1024, npu.Seconds(mm(256, 4096, 4096))/256)
	// a wide K (FFN-down) runs below the NPU's rate: per FLOP dearer than FFN-up
	assert.Greater(t, npu.Seconds(mm(256, 14336, 4096)), 2*npu.Seconds(mm(256, 4096, 14336)))
	// the GPU is shape-insensitive: same FLOPs, same time
	assert.InDelta(t, gpu.Seconds(mm(256, 14336, 4096)), gpu.Seconds(mm(256, 4096, 14336)), 1e-9)
	// decode is memory-bound: a GEMV costs its weight bytes over the bandwidth
	w := float64(profile.WeightBytes("q4_0", 4096, 4096))
	assert.InDelta(t, gpu.LaunchUS*1e-6+w/(gpu.GBs*1e9), gpu.Seconds(mm(1, 4096, 4096)), 2e-6)
}

func TestProfileIsSimulated(t *testing.T) {
	s, err := Load("sd8gen3")
	require.NoError(t, err)
	for _, name := range ModelNames() {
		m, err := Model(name)
		require.NoError(t, err)
		p, err := s.Profile(m)
		require.NoError(t, err)
		assert.True(t, p.Simulated())
		assert.Equal(t, "simulated:sd8gen3", p.Source)
		assert.Contains(t, p.Notes[0], "PREDICTED")
		assert.Equal(t, s.CombinedGBs, p.CombinedGBs)
		npu := p.UnitIndex("npu")
		assert.Equal(t, []int{1, 32, 64, 128, 256, 512, 1024}, p.Units[npu].StaticM)
		// the tabulated profile gives the model's time at its grid points
		q := profile.Query{Op: profile.OpMatMul, DType: m.DType, M: 256, K: m.Dim, N: m.FFN}
		got, err := p.Time(npu, q)
		require.NoError(t, err)
		assert.InDelta(t, s.Units[s.unitIndex("npu")].Seconds(q), got.Seconds(), 1e-9)
	}
	_, err = Model("gpt-5")
	require.ErrorIs(t, err, ErrUnknown)
}

// The done-when of the SoC model (simulated, predicted): for Qwen1.5-1.8B on the SD8 Gen 3
// description, out-of-order prefill has a lower bubble rate than in-order, and tensor-level
// partitioning beats layer-level.
func TestQwenOnSD8Gen3(t *testing.T) {
	s, err := Load("sd8gen3")
	require.NoError(t, err)
	m, err := Model("qwen1.5-1.8b")
	require.NoError(t, err)
	p, err := s.Profile(m)
	require.NoError(t, err)
	layer, err := solve.Solve(p, solve.Options{Mode: solve.Layer})
	require.NoError(t, err)
	tensor, err := solve.Solve(p, solve.Options{Mode: solve.Tensor})
	require.NoError(t, err)
	assert.Less(t, tensor.Prefill.Time, layer.Prefill.Time, "tensor-level beats layer-level")
	for _, pl := range []*solve.Plan{layer, tensor} {
		in, err := solve.Replay(p, pl, dag.InOrder)
		require.NoError(t, err)
		ooo, err := solve.Replay(p, pl, dag.OutOfOrder)
		require.NoError(t, err)
		t.Logf("%v: bubble in order %.1f%%, out of order %.1f%%", pl.Mode, 100*in.Bubble, 100*ooo.Bubble)
		assert.Less(t, ooo.Bubble, in.Bubble, "%v", pl.Mode)
		assert.Less(t, ooo.Makespan, in.Makespan, "%v", pl.Mode)
		assert.LessOrEqual(t, pl.Prefill.Time, pl.SinglePrefill.Time)
	}
}

func TestCompareWithPapers(t *testing.T) {
	s, err := Load("sd8gen3")
	require.NoError(t, err)
	m, err := Model("qwen1.5-1.8b")
	require.NoError(t, err)
	cs, err := s.Compare(m)
	require.NoError(t, err)
	require.Len(t, cs, 3)
	for _, c := range cs {
		assert.Positive(t, c.Predicted, c.Figure.Metric)
		assert.InDelta(t, c.Predicted/c.Figure.Value, c.Ratio, 1e-12)
		assert.NotEmpty(t, c.Figure.Source)
	}
}

func FuzzParse(f *testing.F) {
	b, err := socFiles.ReadFile("socs/sd8gen3.json")
	require.NoError(f, err)
	f.Add(b)
	f.Add([]byte(`{"name":"x","dram_gbs":1,"combined_gbs":1,"units":[{"name":"a","kind":"cpu","tflops":{"f16":1},"gbs":1,"attention_eff":1}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			return
		}
		// a description that parses tabulates into a valid profile for a small model
		m := profile.Model{Name: "m", Layers: 1, Dim: 64, FFN: 128, Heads: 2, KVHeads: 1, HeadDim: 32, Vocab: 50, DType: "q8_0"}
		p, err := s.Profile(m)
		if err != nil {
			return
		}
		require.NoError(t, p.Validate())
	})
}
