package llm

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// StageHook is how a technique takes over the stage graphs of a runner's one-token decode
// program (decode shards: package llm/shard). Runner.prepare keeps what every program shares
// (the activation lanes, the cache and position bindings, placement of the other nodes by the
// plan, compiling) and asks the hook, stage by stage, for the graph, the units of its own nodes
// and its extra bindings. The W8A8 lowering, the sparse FFN and speculative decoding plug in
// through the other hooks (ProjectionHook, ChunkHook, Strategy).
type StageHook interface {
	// Stage builds stage s (0: the embedding; s: layer s-1) of a one-token step over sm's cache.
	Stage(sm *Seam, s int) (HookStage, error)
	// Bind adds stage s's own inputs to byName, given the lanes of q the stage reads (qIn) and
	// writes (qOut), and returns its outputs after x; the last stage's are the runner's (the
	// logits).
	Bind(sm *Seam, s int, qIn, qOut []sched.Span, byName map[string]sched.Binding) ([]sched.Binding, error)
}

// HookStage is one stage graph of a StageHook and where its own nodes run.
type HookStage struct {
	Graph *core.Graph
	// Units gives the plan unit of each of the hook's nodes, by node ID; the plan's rules
	// place the others.
	Units map[int]int
	// Shared are pieces (node IDs) either of the plan units SharedUnits may run
	// (sched.StageSpec.Shared).
	Shared      [][]int
	SharedUnits [2]int
}

// ShardedDecode is a decode-shard technique's part of one runner: the stage hooks of its decode
// programs, one per cut of the layers, of which the runner prepares every one.
type ShardedDecode interface {
	// Hooks are the stage hooks of the decode programs, one per cut.
	Hooks() []StageHook
	// Current is the hook whose program runs the next decode step.
	Current() int
	// Observe takes the plan units' busy time in the decode step that just ran (Current's), so
	// that Current may move to another cut.
	Observe(busy []time.Duration, log *slog.Logger)
}

// ShardsFunc makes the decode shards of a plan's shards ps for m, or says why m cannot be
// sharded so.
type ShardsFunc func(m *Model, ps *sched.PlanShards) (ShardedDecode, error)

var shardsFunc atomic.Pointer[ShardsFunc]

// RegisterShards makes f the technique that runs plans with decode shards (package llm/shard
// registers itself in its init, as database/sql drivers do); a nil f unregisters.
func RegisterShards(f ShardsFunc) {
	if f == nil {
		shardsFunc.Store(nil)
		return
	}
	shardsFunc.Store(&f)
}

// newShards is the registered technique's decode shards ps of m.
func newShards(m *Model, ps *sched.PlanShards) (*runnerShards, error) {
	f := shardsFunc.Load()
	if f == nil {
		return nil, fmt.Errorf(`llm: the plan shards decode steps, and no shard package is registered (import _ "github.com/xpuhub/xpu/llm/shard"): %w`,
			core.ErrUnsupported)
	}
	sd, err := (*f)(m, ps)
	if err != nil {
		return nil, err
	}
	sh := &runnerShards{ShardedDecode: sd, hooks: sd.Hooks()}
	if len(sh.hooks) == 0 {
		return nil, fmt.Errorf("llm: decode shards with no stage hook: %w", core.ErrInvalidArgument)
	}
	sh.build = min(max(sd.Current(), 0), len(sh.hooks)-1)
	return sh, nil
}

// current is the decode program of the shards' current hook.
func (sh *runnerShards) current() (*chunkProg, error) {
	i := sh.Current()
	if i < 0 || i >= len(sh.progs) {
		return nil, fmt.Errorf("llm: decode shards chose program %d of %d: %w", i, len(sh.progs), core.ErrInternal)
	}
	return sh.progs[i], nil
}

// check refuses a hook's stage s with no graph or a node on a unit the plan does not have.
func (h HookStage) check(s, units int) error {
	if h.Graph == nil {
		return fmt.Errorf("llm: stage hook built no graph for stage %d: %w", s, core.ErrInvalidArgument)
	}
	for id, u := range h.Units {
		if u < 0 || u >= units {
			return fmt.Errorf("llm: stage hook puts node %d of stage %d on unit %d of %d: %w", id, s, u, units, core.ErrInvalidArgument)
		}
	}
	if len(h.Shared) > 0 && (h.SharedUnits[0] < 0 || h.SharedUnits[0] >= units || h.SharedUnits[1] < 0 || h.SharedUnits[1] >= units) {
		return fmt.Errorf("llm: stage hook shares stage %d's pieces between units %v of %d: %w", s, h.SharedUnits, units, core.ErrInvalidArgument)
	}
	return nil
}

// runnerShards is a runner's decode shards: one decode program per hook.
type runnerShards struct {
	ShardedDecode
	hooks []StageHook
	progs []*chunkProg
	build int // the hook prepare builds with
}

// stageHook is the hook that builds a program of chunk length c in phase (tree: a tree
// verify), or nil when the model's own stage graphs do.
func (r *Runner) stageHook(phase sched.Phase, c int64, tree bool) StageHook {
	if r.shards != nil && phase == sched.PhaseDecode && c == 1 && !tree {
		return r.shards.hooks[r.shards.build]
	}
	return nil
}

// prepareShards makes the decode program of every hook but the current one, which init
// prepared.
func (r *Runner) prepareShards(ctx context.Context, step func()) error {
	sh := r.shards
	sh.progs = make([]*chunkProg, len(sh.hooks))
	sh.progs[sh.build] = r.progs[1]
	cur := sh.build
	defer func() { sh.build = cur }()
	for i := range sh.hooks {
		if i == cur {
			continue
		}
		sh.build = i
		cp, err := r.prepare(ctx, 1, step, false)
		if err != nil {
			return err
		}
		sh.progs[i] = cp
	}
	return nil
}

// observeShards hands the decode step that just ran to the shards, which may move their cut.
func (r *Runner) observeShards() {
	if r.shards == nil || len(r.shards.hooks) < 2 {
		return
	}
	run := r.progs[1].prog.LastRun().Busy
	busy := make([]time.Duration, len(r.unitIdx))
	for i, u := range r.unitIdx {
		if u >= len(run) {
			return
		}
		busy[i] = run[u]
	}
	r.shards.Observe(busy, r.cfg.logger)
}

// Columns is the constant of weight name's columns [k0, k0+n) of every row: a copy, made once
// per model and range (the upload of a constant is keyed by its bytes). A weight that is not a
// matrix or a range outside its columns fails g (Graph.Err).
func (m *Model) Columns(g *core.Graph, name string, k0, n int64) *core.Tensor {
	w := m.weights[name]
	key := fmt.Sprintf("%s[:, %d:%d]", name, k0, k0+n)
	if len(w.shape) != 2 || k0 < 0 || n <= 0 || k0+n > w.shape[1] {
		return g.Const(key, w.dtype, core.Shape{1}, nil) // fails: no bytes
	}
	rows, k := w.shape[0], w.shape[1]
	m.colMu.Lock()
	data, ok := m.cols[key]
	if !ok {
		row, off, size := w.dtype.Bytes(k), w.dtype.Bytes(k0), w.dtype.Bytes(n)
		data = make([]byte, rows*size)
		for r := range rows {
			copy(data[r*size:(r+1)*size], w.data[r*row+off:r*row+off+size])
		}
		if m.cols == nil {
			m.cols = map[string][]byte{}
		}
		m.cols[key] = data
	}
	m.colMu.Unlock()
	return g.Const(key, w.dtype, core.Shape{rows, n}, data)
}

// columnCache is the Model's store of copied weight columns (Model.Columns).
type columnCache struct {
	colMu sync.Mutex
	cols  map[string][]byte
}
