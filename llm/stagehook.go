package llm

import (
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// stageHook is how a technique takes over the stage graphs of the programs it claims
// (Runner.stageHook picks it per program): Runner.prepare keeps what every program shares
// (the activation lanes, the cache and position bindings, placement by the plan, compiling)
// and asks the hook, stage by stage, for the graph, the units of its own nodes, its extra
// bindings and the stage options. Decode shards build through it; the W8A8 lowering, the
// sparse FFN and speculative decoding plug in through the exported hooks (ProjectionHook,
// ChunkHook, Strategy).
type stageHook interface {
	// build makes stage s (0: the embedding; s: layer s-1), recording in sb which of its nodes
	// run on which of the hook's units (stageBuild.shard) or on either (stageBuild.shared).
	build(r *Runner, s int, sb *stageBuild) (*core.Graph, error)
	// unit is the plan unit of the hook's unit i.
	unit(i int) int
	// bind adds stage s's own inputs to byName, given the lanes of q the stage reads (qIn)
	// and writes (qOut), and returns its outputs after x; the last stage's are the runner's
	// (the logits).
	bind(r *Runner, s int, qIn, qOut []sched.Span, byName map[string]sched.Binding) ([]sched.Binding, error)
	// spec completes stage s's StageSpec.
	spec(r *Runner, st *sched.StageSpec)
}

// stageHook is the hook that builds a program of chunk length c in phase (tree: a tree
// verify), or nil when the model's own stage graphs do.
func (r *Runner) stageHook(phase sched.Phase, c int64, tree bool) stageHook {
	if r.shards != nil && phase == sched.PhaseDecode && c == 1 && !tree {
		return r.shards
	}
	return nil
}
