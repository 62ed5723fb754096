package solve

import (
	"github.com/xpuhub/xpu/sched/profile"
)

// opDef is one op of a decoder layer (or of the output head) as the solver places it: its
// node names in the model's graph (llm/arch/stage.go), its profile class and its shape for a chunk
// of m rows over kv key rows.
type opDef struct {
	Name  string
	Nodes []string // plan node patterns; nil for the norms, placed by op (RMS_NORM and its MUL)
	Class string
	query func(m, kv int) profile.Query
	// matmul ops may be split across units
	matmul bool
	// passes is how many times the op's profile time it costs (0: once)
	passes int
	// headAlign, for attention, is the query width of one KV head's group: a heads split
	// cuts N at its multiples
	headAlign int
	// shard is the share a sharded decode (StrategyShard) gives each unit of the op: its KV
	// heads' (Q/K/V rows, RoPE, attention, the output projection) or its FFN neurons' (gate
	// and up rows, the activation, the down projection); shardNone for the ops the shards
	// meet at (norms, residual adds) and the head
	shard int
	// cols marks the MATMULs a shard cuts along K (its columns of the output and down
	// projections), each unit's part a partial sum
	cols bool
}

// The shares of a sharded decode (opDef.shard).
const (
	shardNone = iota
	shardHeads
	shardNeurons
)

// layerOps are a decoder layer's ops in execution order, then the head's (output norm and
// logits) as headOps.
func layerOps(md profile.Model) (layer, head []opDef) {
	mms := map[string]profile.MatMul{}
	for _, mm := range md.MatMuls() {
		mms[mm.Name] = mm
	}
	mat := func(name string) opDef {
		mm := mms[name]
		return opDef{Name: name, Nodes: []string{name}, Class: profile.OpMatMul, matmul: true,
			query: func(m, _ int) profile.Query {
				return profile.Query{Op: profile.OpMatMul, DType: mm.DType, M: m, K: mm.K, N: mm.N}
			}}
	}
	flat := func(name string, nodes []string, class string, n int) opDef {
		return opDef{Name: name, Nodes: nodes, Class: class,
			query: func(m, _ int) profile.Query { return profile.Query{Op: class, M: m, N: n} }}
	}
	q := md.Heads * md.HeadDim
	// the activation (SiLU, ReLU or ReLU²'s RELU and MUL) then the MUL by up: two element-wise
	// passes over [M, FFN] (three for ReLU², counted as two)
	act := flat("ffn_act", []string{"ffn_silu", "ffn_relu", "ffn_relu2", "ffn_swiglu"}, profile.OpElementwise, md.FFN)
	act.passes = 2
	sharded := func(o opDef, side int, cols bool) opDef {
		o.shard, o.cols = side, cols
		return o
	}
	layer = []opDef{
		flat("attn_norm", nil, profile.OpNorm, md.Dim),
		sharded(mat("attn_q"), shardHeads, false), sharded(mat("attn_k"), shardHeads, false),
		sharded(mat("attn_v"), shardHeads, false),
		sharded(flat("rope", []string{"q_rope", "k_rope"}, profile.OpRope, (md.Heads+md.KVHeads)*md.HeadDim), shardHeads, false),
		{Name: "attn", Nodes: []string{"attn"}, Class: profile.OpAttention, headAlign: q / md.KVHeads, shard: shardHeads,
			query: func(m, kv int) profile.Query { return profile.Query{Op: profile.OpAttention, M: m, K: kv, N: q} }},
		sharded(mat("attn_output"), shardHeads, true),
		flat("attn_residual", []string{"attn_residual"}, profile.OpElementwise, md.Dim),
		flat("ffn_norm", nil, profile.OpNorm, md.Dim),
		sharded(mat("ffn_gate"), shardNeurons, false), sharded(mat("ffn_up"), shardNeurons, false),
		sharded(act, shardNeurons, false),
		sharded(mat("ffn_down"), shardNeurons, true),
		flat("ffn_residual", []string{"ffn_residual"}, profile.OpElementwise, md.Dim),
	}
	head = []opDef{
		flat("output_norm", nil, profile.OpNorm, md.Dim),
		mat("logits"),
	}
	return layer, head
}

// isNorm marks the ops a plan places by op name (an unnamed RMS_NORM and its MUL): they share
// one unit, since a plan cannot tell them apart.
func (o opDef) isNorm() bool { return o.Class == profile.OpNorm }
