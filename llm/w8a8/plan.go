package w8a8

import (
	"slices"
	"strings"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// Plan adapts a plan to the W8A8 lowering (WithLowering): no decode shards, and in each
// phase, before a MATMUL rule that has a unit, a fallback unit and no split, a rule that sends the float output head ("logits") to
// the fallback unit: an int8 NPU runs float products slowly and at reduced precision (FP16 on
// the HTP). QUANTIZE, SHADOW_MATMUL and its ADD fall to the rules for everything else (the CPU
// unit in sched.DefaultPlan): the CPU holds the float activation the shadow path reads anyway,
// quantizes it in f32 and hands the NPU int8 (a quarter of the bytes). Quantizing on the
// emulated HTP instead, whose Quantize reads half precision, flipped stories260K's greedy text
// after 27 tokens where the CPU's keeps all 64. p is not changed.
func Plan(p *sched.Plan) *sched.Plan {
	// decode shards build their projections themselves, so a lowered plan has none
	out := *p
	out.Decode.Shards = nil
	adapt := func(ph sched.PhasePlan) sched.PhasePlan {
		var rules []sched.Rule
		for _, r := range ph.Rules {
			if r.Unit != "" && r.Fallback != "" && r.Split == nil && slices.ContainsFunc(r.Ops, func(o string) bool {
				return strings.EqualFold(o, core.OpMatMul.String())
			}) {
				rules = append(rules, sched.Rule{Unit: r.Fallback, Ops: []string{core.OpMatMul.String()}, Nodes: []string{"logits"}})
			}
			rules = append(rules, r)
		}
		ph.Rules = rules
		return ph
	}
	out.Prefill, out.Decode = adapt(out.Prefill), adapt(out.Decode)
	return &out
}
