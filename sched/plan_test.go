package sched

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

func node(name string, op core.Op) *core.Node { return &core.Node{Name: name, Op: op} }

func TestPlanPlacesByOpLayerAndName(t *testing.T) {
	p, err := ParsePlan([]byte(`{
		"units": ["neon{cpus=0,threads=1}", "neon:0{threads=1,cpus=1}", "qnn"],
		"prefill": {"chunk": 16, "rules": [
			{"unit": "qnn:0", "ops": ["matmul"], "layers": "0-1,4-"},
			{"unit": "1", "nodes": ["ffn_*"]},
			{"unit": "neon{threads=1;cpus=0}"}
		]},
		"decode": {"rules": [{"unit": "2", "fallback": "0"}]}
	}`))
	require.NoError(t, err)
	rp, err := p.Resolve()
	require.NoError(t, err)
	tests := []struct {
		phase    Phase
		layer    int
		n        *core.Node
		unit, fb int
	}{
		{PhasePrefill, 0, node("blk.0.attn_q", core.OpMatMul), 2, -1},
		{PhasePrefill, 2, node("blk.2.attn_q", core.OpMatMul), 0, -1},
		{PhasePrefill, 2, node("blk.2.ffn_up", core.OpMatMul), 1, -1},
		{PhasePrefill, 7, node("blk.7.ffn_up", core.OpMatMul), 2, -1},
		{PhasePrefill, 3, node("blk.3.ffn_swiglu", core.OpMul), 1, -1},
		{PhasePrefill, 3, node("blk.3.attn", core.OpAttention), 0, -1},
		{PhaseDecode, 3, node("blk.3.attn", core.OpAttention), 2, 0},
	}
	for _, tt := range tests {
		u, fb, err := rp.Place(tt.phase, tt.layer, tt.n)
		require.NoError(t, err)
		assert.Equal(t, tt.unit, u, "%s %s", tt.phase, tt.n.Name)
		assert.Equal(t, tt.fb, fb, "%s %s", tt.phase, tt.n.Name)
	}
	// the JSON round-trips
	p2, err := ParsePlan(p.JSON())
	require.NoError(t, err)
	assert.Equal(t, p, p2)
}

func TestPlanErrors(t *testing.T) {
	tests := []struct{ name, js, want string }{
		{"no units", `{"prefill":{"rules":[{"unit":"0"}]}}`, "no units"},
		{"no rules", `{"units":["neon"]}`, "no rules"},
		{"unknown field", `{"units":["neon"],"prefill":{"rulez":[]}}`, "rulez"},
		{"bad unit spec", `{"units":["neon{"],"prefill":{"rules":[{"unit":"0"}]}}`, "bad unit spec"},
		{"unlisted unit", `{"units":["neon"],"prefill":{"rules":[{"unit":"opencl"}]}}`, "not one of the plan's units"},
		{"unit index", `{"units":["neon"],"prefill":{"rules":[{"unit":"3"}]}}`, "unit #3"},
		{"bad op", `{"units":["neon"],"prefill":{"rules":[{"unit":"0","ops":["MATMAL"]}]}}`, "MATMAL"},
		{"bad layers", `{"units":["neon"],"prefill":{"rules":[{"unit":"0","layers":"5-2"}]}}`, "bad range"},
		{"bad pattern", `{"units":["neon"],"prefill":{"rules":[{"unit":"0","nodes":["["]}]}}`, "node pattern"},
		{"twice", `{"units":["neon","neon:0"],"prefill":{"rules":[{"unit":"0"}]}}`, "listed twice"},
		{"bad fallback", `{"units":["neon"],"prefill":{"rules":[{"unit":"0","fallback":"qnn"}]}}`, "fallback"},
		{"split strategy", `{"units":["a","b"],"prefill":{"rules":[{"split":{"strategy":"cols","units":["a","b"],"ratio":[0.5,0.5]}}]}}`, "strategy"},
		{"split ratio sum", `{"units":["a","b"],"prefill":{"rules":[{"split":{"strategy":"rows","units":["a","b"],"ratio":[0.5,0.6]}}]}}`, "sums to"},
		{"split ratio count", `{"units":["a","b"],"prefill":{"rules":[{"split":{"strategy":"seq","units":["a","b"],"ratio":[1]}}]}}`, "1 ratios"},
		{"split unlisted unit", `{"units":["a","b"],"prefill":{"rules":[{"split":{"strategy":"rows","units":["a","c"],"ratio":[0.5,0.5]}}]}}`, "not one of"},
		{"split unit twice", `{"units":["a","b"],"prefill":{"rules":[{"split":{"strategy":"rows","units":["a","0"],"ratio":[0.5,0.5]}}]}}`, "listed twice"},
		{"steal with seq", `{"units":["a","b"],"prefill":{"rules":[{"split":{"strategy":"seq","units":["a","b"],"ratio":[0.5,0.5],"steal":true}}]}}`, "steal and adapt are for rows"},
		{"adapt with seq", `{"units":["a","b"],"prefill":{"rules":[{"split":{"strategy":"seq","units":["a","b"],"ratio":[0.5,0.5],"adapt":true}}]}}`, "steal and adapt are for rows"},
		{"steal and adapt", `{"units":["a","b"],"prefill":{"rules":[{"split":{"strategy":"rows","units":["a","b"],"ratio":[0.5,0.5],"steal":true,"adapt":true}}]}}`, "steal and adapt together"},
		{"steal over three", `{"units":["a","b","c"],"prefill":{"rules":[{"split":{"strategy":"rows","units":["a","b","c"],"ratio":[0.2,0.3,0.5],"steal":true}}]}}`, "two units"},
		{"split one unit", `{"units":["a","b"],"prefill":{"rules":[{"split":{"strategy":"rows","units":["a"],"ratio":[1]}}]}}`, "1 units"},
		{"multiseq lengths", `{"units":["a","b"],"prefill":{"rules":[{"split":{"strategy":"multiseq","units":["a","b"]}}]}}`, "no standard lengths"},
		{"multiseq ratio", `{"units":["a","b"],"prefill":{"rules":[{"split":{"strategy":"multiseq","units":["a","b"],"ratio":[0.5,0.5],"lengths":[32]}}]}}`, "no ratio"},
		{"hybrid three units", `{"units":["a","b","c"],"prefill":{"rules":[{"split":{"strategy":"hybrid","units":["a","b","c"],"ratio":[0.2,0.3,0.5],"lengths":[32]}}]}}`, "need 2"},
		{"split and fallback", `{"units":["a","b"],"prefill":{"rules":[{"unit":"a","fallback":"b","split":{"strategy":"rows","units":["a","b"],"ratio":[0.5,0.5]}}]}}`, "fallback"},
		{"split unknown field", `{"units":["a","b"],"prefill":{"rules":[{"split":{"strategy":"rows","units":["a","b"],"ratios":[0.5,0.5]}}]}}`, "unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParsePlan([]byte(tt.js))
			require.ErrorIs(t, err, ErrBadPlan)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	rp, err := (&Plan{Units: []string{"neon"}, Prefill: PhasePlan{Rules: []Rule{{Unit: "0", Ops: []string{"MATMUL"}}}}}).Resolve()
	require.NoError(t, err)
	_, _, err = rp.Place(PhaseDecode, 0, node("embd", core.OpGetRows))
	require.ErrorIs(t, err, ErrNoRule)
	assert.Contains(t, err.Error(), "embd")
}

// TestPlanSplit: a split rule gives its MATMULs the split (units as plan indices) and places
// its other nodes, and the merges, on its unit (default: the split's first unit).
func TestPlanSplit(t *testing.T) {
	p, err := ParsePlan([]byte(`{"units":["neon{cpus=0}","opencl","qnn"],"prefill":{"rules":[
		{"layers":"0-3","split":{"strategy":"multiseq","units":["qnn","opencl"],"lengths":[256,32]}},
		{"unit":"0","ops":["MATMUL"],"split":{"strategy":"rows","units":["opencl","neon{cpus=0}"],"ratio":[0.7,0.3]}},
		{"unit":"0"}]}}`))
	require.NoError(t, err)
	rp, err := p.Resolve()
	require.NoError(t, err)
	u, fb, sp, err := rp.PlaceSplit(PhasePrefill, 2, node("blk.2.attn_q", core.OpMatMul))
	require.NoError(t, err)
	assert.Equal(t, 2, u, "the merge unit defaults to the split's first")
	assert.Equal(t, -1, fb)
	assert.Equal(t, &PlanSplit{Strategy: SplitMultiSeq, Units: []int{2, 1}, Lengths: []int64{256, 32}}, sp)
	u, _, sp, err = rp.PlaceSplit(PhasePrefill, 2, node("blk.2.attn_norm", core.OpRMSNorm))
	require.NoError(t, err)
	assert.Equal(t, 2, u)
	assert.Nil(t, sp, "only MATMULs split")
	u, _, sp, err = rp.PlaceSplit(PhaseDecode, 7, node("blk.7.ffn_up", core.OpMatMul))
	require.NoError(t, err)
	assert.Equal(t, 0, u)
	assert.Equal(t, &PlanSplit{Strategy: SplitRows, Units: []int{1, 0}, Ratio: []float64{0.7, 0.3}}, sp)
	// the plan round-trips through its JSON
	again, err := ParsePlan(p.JSON())
	require.NoError(t, err)
	assert.Equal(t, p, again)
}

func FuzzParsePlan(f *testing.F) {
	f.Add([]byte(`{"units":["neon","qnn"],"prefill":{"rules":[{"unit":"qnn","ops":["MATMUL"],"layers":"0-3,5-"},{"unit":"0"}]}}`))
	f.Add([]byte(`{"units":["neon{cpus=0,threads=1}"],"decode":{"rules":[{"unit":"0","nodes":["ffn_*"]}]}}`))
	f.Add([]byte(`{"units":["a","b"],"prefill":{"rules":[{"split":{"strategy":"hybrid","units":["a","b"],"ratio":[0.5,0.5],"lengths":[32]}}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePlan(data)
		if err != nil {
			return
		}
		rp, err := p.Resolve()
		require.NoError(t, err)
		u, fb, err := rp.Place(PhasePrefill, 1, node("blk.1.ffn_up", core.OpMatMul))
		if err == nil {
			assert.True(t, u >= 0 && u < len(rp.Specs))
			assert.True(t, fb >= -1 && fb < len(rp.Specs))
		}
	})
}

func TestDefaultPlan(t *testing.T) {
	specs, err := ParseUnitList("neon,opencl,qnn")
	require.NoError(t, err)
	p := DefaultPlan(specs, []core.DeviceKind{core.DeviceCPU, core.DeviceCPU, core.DeviceNPU}, 4)
	rp, err := p.Resolve()
	require.NoError(t, err)
	for _, c := range []struct {
		op   core.Op
		unit int
	}{{core.OpMatMul, 2}, {core.OpAttention, 1}, {core.OpRMSNorm, 0}} {
		u, fb, err := rp.Place(PhaseDecode, 1, node("blk.1.x", c.op))
		require.NoError(t, err)
		assert.Equal(t, c.unit, u, "%s", c.op)
		if c.op != core.OpRMSNorm {
			assert.Equal(t, 0, fb, "refused %s falls back to the rest unit", c.op)
		}
	}

	specs, err = ParseUnitList("neon{cpus=0,threads=1},neon{cpus=1,threads=1}")
	require.NoError(t, err)
	p = DefaultPlan(specs, []core.DeviceKind{core.DeviceCPU, core.DeviceCPU}, 5)
	rp, err = p.Resolve()
	require.NoError(t, err)
	for l, want := range []int{0, 0, 1, 1, 1} {
		u, _, err := rp.Place(PhasePrefill, l, node("blk.x", core.OpMatMul))
		require.NoError(t, err)
		assert.Equal(t, want, u, "layer %d", l)
	}

	p = DefaultPlan(specs[:1], []core.DeviceKind{core.DeviceCPU}, 5)
	rp, err = p.Resolve()
	require.NoError(t, err)
	u, _, err := rp.Place(PhaseDecode, 4, node("logits", core.OpMatMul))
	require.NoError(t, err)
	assert.Equal(t, 0, u)
}

// TestPlanDocExample: the plan in PLAN.md parses, so the documentation cannot drift from the
// format.
func TestPlanDocExample(t *testing.T) {
	doc, err := os.ReadFile("PLAN.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(doc), "```json\n")
	require.True(t, ok, "PLAN.md has a json block")
	js, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	p, err := ParsePlan([]byte(js))
	require.NoError(t, err)
	rp, err := p.Resolve()
	require.NoError(t, err)
	assert.Len(t, rp.Specs, 4)
	u, fb, err := rp.Place(PhasePrefill, 3, node("blk.3.ffn_up", core.OpMatMul))
	require.NoError(t, err)
	assert.Equal(t, []int{3, 2}, []int{u, fb})
	u, _, err = rp.Place(PhasePrefill, 9, node("blk.9.ffn_norm", core.OpRMSNorm))
	require.NoError(t, err)
	assert.Equal(t, 1, u)
	// the split example
	_, rest, ok = strings.Cut(rest, "```json\n")
	require.True(t, ok, "PLAN.md has a split example")
	js, _, ok = strings.Cut(rest, "```")
	require.True(t, ok)
	p, err = ParsePlan([]byte(js))
	require.NoError(t, err)
	rp, err = p.Resolve()
	require.NoError(t, err)
	_, _, sp, err := rp.PlaceSplit(PhasePrefill, 3, node("blk.3.ffn_down", core.OpMatMul))
	require.NoError(t, err)
	assert.Equal(t, SplitRows, sp.Strategy)
	_, _, sp, err = rp.PlaceSplit(PhasePrefill, 3, node("blk.3.attn_q", core.OpMatMul))
	require.NoError(t, err)
	assert.Equal(t, &PlanSplit{Strategy: SplitMultiSeq, Units: []int{2, 1}, Lengths: []int64{512, 32}}, sp)
	_, _, sp, err = rp.PlaceSplit(PhaseDecode, 3, node("blk.3.attn_q", core.OpMatMul))
	require.NoError(t, err)
	assert.Equal(t, []int{1, 0}, sp.Units)
}
