package w8a8

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/xpuhub/xpu/sched"
)

func TestPlan(t *testing.T) {
	npu := sched.Rule{Unit: "qnn", Fallback: "neon", Ops: []string{"matmul"}}
	head := sched.Rule{Unit: "neon", Ops: []string{"MATMUL"}, Nodes: []string{"logits"}}
	cpu := sched.Rule{Unit: "neon"}
	for _, c := range []struct {
		name  string
		rules []sched.Rule
		want  []sched.Rule
	}{
		{"the output head goes to an int8 MATMUL rule's fallback", []sched.Rule{npu, cpu}, []sched.Rule{head, npu, cpu}},
		{"a rule without a fallback is kept as it is", []sched.Rule{{Unit: "qnn", Ops: []string{"MATMUL"}}, cpu},
			[]sched.Rule{{Unit: "qnn", Ops: []string{"MATMUL"}}, cpu}},
		{"a split rule is kept as it is", []sched.Rule{{Unit: "qnn", Fallback: "neon", Ops: []string{"MATMUL"}, Split: &sched.Split{}}},
			[]sched.Rule{{Unit: "qnn", Fallback: "neon", Ops: []string{"MATMUL"}, Split: &sched.Split{}}}},
		{"a rule for other ops is kept as it is", []sched.Rule{{Unit: "qnn", Fallback: "neon", Ops: []string{"ATTENTION"}}},
			[]sched.Rule{{Unit: "qnn", Fallback: "neon", Ops: []string{"ATTENTION"}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &sched.Plan{Prefill: sched.PhasePlan{Rules: c.rules},
				Decode: sched.PhasePlan{Rules: c.rules, Shards: &sched.Shards{Units: []string{"qnn", "neon"}}}}
			got := Plan(p)
			assert.Equal(t, c.want, got.Prefill.Rules)
			assert.Equal(t, c.want, got.Decode.Rules)
			assert.Nil(t, got.Decode.Shards, "decode shards dropped")
			assert.NotNil(t, p.Decode.Shards, "p is not changed")
			assert.Equal(t, c.rules, p.Prefill.Rules, "p is not changed")
		})
	}
}
