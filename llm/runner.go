package llm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// ErrContextFull: the tokens do not fit in the KV cache.
var ErrContextFull = errors.New("llm: context is full")

// DefaultChunk is the prefill chunk length when none is given.
const DefaultChunk = 64

// maxDefaultContext caps the KV cache when the caller gives no context length: models declare
// contexts (128K) whose cache would not fit a phone.
const maxDefaultContext = 4096

// DefaultContextLength is the context length a runner of m gets without WithContextLength.
func DefaultContextLength(m *Model) int { return min(m.Config.ContextLength, maxDefaultContext) }

// maxContext bounds a requested context so that cache sizes cannot overflow.
const maxContext = 1 << 24

type runnerConfig struct {
	kv kvTypes
	// kvSet: the caller chose the KV cache dtypes (else a backend that refuses the default
	// gets an F32 cache)
	kvSet    bool
	chunk    int
	ctxLen   int
	options  map[string]string
	progress func(done, total int)
	logger   *slog.Logger
	trace    *sched.Trace
	rt       *sched.Runtime
	// stageChecks: check every stage's outputs for NaN/Inf (WithStageChecks, debug logging).
	stageChecks bool
	// analyzeFirst: tell a prepare refusal after analysis apart (WithAnalyzeFirst).
	analyzeFirst bool
	// phaseOpts: prepare options of the CPU units per phase (WithPhaseOptions).
	phaseOpts map[sched.Phase]map[string]string
	// verify: the verify lengths prepared for speculative decoding (WithVerifyLengths).
	verify []int
	// w8: the W8A8 lowering of the projections (WithW8A8); nil runs them as the model has them.
	w8 *W8A8
	// tap, when set, is handed every MATMUL input and output after each run (calibration).
	tap func(w tapWhat, data []byte)
	// sparse runs the FFNs sparsely (WithSparseFFN); nil runs them dense.
	sparse SparseFFN
	// slot, for a runner of a Batch, is where its cache lies in the batch's (batch.go).
	slot *batchSlot
	// hidden: the last stage outputs the final-normed hidden state instead of the logits
	// (an Embedder's runner, embed.go).
	hidden bool
}

// RunnerOption configures NewRunner.
type RunnerOption func(*runnerConfig)

// WithChunkSize sets the prefill chunk length (default DefaultChunk). Decoding always uses
// chunk length 1.
func WithChunkSize(n int) RunnerOption { return func(c *runnerConfig) { c.chunk = n } }

// WithKVCacheType stores the K and the V cache in dt: F16 (the default, DefaultKVCacheType),
// F32, or Q8_0 or Q4_0 (blocks of 32 along the head dimension, which must hold whole blocks),
// which halve and quarter F16's memory and the bytes attention reads per token at some cost in
// precision. Without it, a runner whose device refuses an F16 cache (a backend with no FLOAT_16
// ops) gets an F32 one.
func WithKVCacheType(dt core.DType) RunnerOption { return WithKVCacheTypes(dt, dt) }

// WithKVCacheTypes stores the K cache in k and the V cache in v (see WithKVCacheType), as
// llama.cpp's --cache-type-k and --cache-type-v: K's rounding moves every attention score, V's
// only the weighted sum, so a quantized V with an F16 K keeps more of the precision.
func WithKVCacheTypes(k, v core.DType) RunnerOption {
	return func(c *runnerConfig) { c.kv, c.kvSet = kvTypes{k, v}, true }
}

// WithContextLength sets the KV cache length in tokens (default: the model's, at most 4096).
func WithContextLength(n int) RunnerOption { return func(c *runnerConfig) { c.ctxLen = n } }

// WithContextOptions passes backend-specific options to Device.NewContext: NewRunner's unit
// takes them, and NewPlannedRunner's units take those their specs do not set.
func WithContextOptions(o map[string]string) RunnerOption {
	return func(c *runnerConfig) { c.options = o }
}

// WithPhaseOptions prepares the prefill programs with the prepare options prefill and the
// decode program with decode, on every CPU unit of the plan (other units get none). On the
// neon plugin these are cpus= and threads= (cputopo.NeonPhaseOptions gives them for a core
// selection, with the context options that size the pool for both): both phases' executables
// live on one context and share its weights and worker pool, so switching phase is running the
// other executable, which re-pins the workers; nothing is reallocated or repacked. A nil map
// leaves that phase on the context's own settings. A bad option (a CPU that is not online) is
// an error from NewRunner.
func WithPhaseOptions(prefill, decode map[string]string) RunnerOption {
	return func(c *runnerConfig) {
		c.phaseOpts = map[sched.Phase]map[string]string{
			sched.PhasePrefill: maps.Clone(prefill), sched.PhaseDecode: maps.Clone(decode)}
	}
}

// WithProgress reports graph preparation (which uploads the weights) as done of total stages.
func WithProgress(f func(done, total int)) RunnerOption {
	return func(c *runnerConfig) { c.progress = f }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) RunnerOption { return func(c *runnerConfig) { c.logger = l } }

// WithTrace records every partition run, cross-unit wait and copy in t: one track per unit,
// each slice with its chunk and layer (write it with t.WriteFile for Perfetto).
func WithTrace(t *sched.Trace) RunnerOption { return func(c *runnerConfig) { c.trace = t } }

// WithRuntime makes NewPlannedRunner run on rt's units instead of opening its own: runners
// sharing a runtime run at the same time where their plans use different units (one sequence's
// prefill on one unit while another decodes on another) and one after the other where they
// meet. The plan's units must be rt's; the runner's trace is rt's (WithTrace is ignored).
// Closing the runner releases its graphs; its cache stays in rt's arena until rt is closed.
func WithRuntime(rt *sched.Runtime) RunnerOption { return func(c *runnerConfig) { c.rt = rt } }

// Runner holds one sequence's state: the KV cache and the stage graphs for the prefill chunk
// length and for decoding, prepared on the units of a plan through a sched.Runtime (the
// runner builds graphs; sched opens the contexts, prepares the partitions and runs them). It
// is not safe for concurrent use.
type Runner struct {
	m     *Model
	cfg   runnerConfig
	plan  *sched.ResolvedPlan
	rt    *sched.Runtime
	cap   int64 // cache rows: the context plus room for a padded last chunk
	kv    [][2]sched.Span
	ids   sched.Span // per position: token ids, positions, query offsets, RoPE tables
	posS  sched.Span
	qoffS sched.Span
	cos   sched.Span
	sin   sched.Span
	progs map[int]*chunkProg
	// vprogs are the verify programs by length (WithVerifyLengths); tree says they take a
	// tree mask (else they verify chains, with the causal mask).
	vprogs  map[int]*chunkProg
	tree    bool
	shift   *shiftProg // the context shift's K rotation, prepared at the first shift
	closed  bool
	shared  bool  // rt is the caller's (WithRuntime)
	unitIdx []int // plan unit → runtime unit
	// shards, when the plan shards decode steps, is their cut of every layer (shard.go), and
	// adapt, with adaptive shards, moves it from step to step.
	shards *shardCut
	adapt  *shardAdapt
	pos    int // tokens in the cache
	// history is the tokens in the cache.
	history []int32
	// cache is the sparse FFN's bundle cache (WithSparseFFN); spTimes where its runs' time went.
	cache   sched.Span
	spTimes [2]SparseTimes // chunks of several tokens, of one
	// busy is set while a call runs on the runner (busy.go): a second one at the same time
	// fails with ErrBusy.
	busy atomic.Bool
	// batch, when the runner is one of a Batch's, runs its decodes in the batch's steps.
	batch *Batch
}

// chunkProg is the program for one chunk length and the lane spans of its logits.
type chunkProg struct {
	c      int64
	prog   *sched.Program
	logits []sched.Span
	// a verify program's own inputs, written before each run (tree verification): positions,
	// RoPE tables (models with frequency factors) and the mask
	pos, cos, sin, mask sched.Span
	tree                bool
	// sp, when the FFN is sparse (WithSparseFFN), replaces prog: its programs per layer.
	sp *sparseProg
}

// NewRunner runs the whole model on one device: a one-unit plan (the unit's options are those of
// WithContextOptions).
func NewRunner(ctx context.Context, m *Model, dev core.Device, opts ...RunnerOption) (*Runner, error) {
	if dev == nil {
		return nil, fmt.Errorf("llm: nil device: %w", core.ErrInvalidArgument)
	}
	cfg := newRunnerConfig(opts)
	info := dev.Info()
	spec := sched.UnitSpec{Backend: info.Backend, Index: info.Index, Options: maps.Clone(cfg.options)}
	plan := &sched.Plan{Units: []string{spec.String()}, Prefill: sched.PhasePlan{Rules: []sched.Rule{{Unit: "0"}}}}
	return newRunnerKV(ctx, m, []core.Device{dev}, plan, cfg)
}

// NewPlannedRunner runs the model on the units of plan, found among devices (every device of
// the loaded backends). Before anything runs the plan is checked: a unit that does not exist, a
// node no rule places and a node its unit refuses are errors naming node, unit and reason.
func NewPlannedRunner(ctx context.Context, m *Model, devices []core.Device, plan *sched.Plan, opts ...RunnerOption) (*Runner, error) {
	if plan == nil {
		return nil, fmt.Errorf("llm: nil plan: %w", core.ErrInvalidArgument)
	}
	return newRunnerKV(ctx, m, devices, plan, newRunnerConfig(opts))
}

// DefaultPlan is sched.DefaultPlan for the units specs names among devices, for m. Where the
// units are all of one kind, decode steps are also sharded over them (the plan's decode
// shards, equal shares) when m's KV heads and weights allow it: the default plan's layer split
// pipelines prefill chunks but runs a decode step on one unit after another, where shards run
// it on all of them at once. W8A8Plan and a sparse FFN drop the shards (WithoutShards).
//
// A unit whose device refuses the model's MATMUL (op_support NO for RepresentativeMatMul: a
// backend that implements a few ops) is partial: sched.DefaultPlanPartial offers it every node
// outside the MATMUL and ATTENTION rules first, and what it refuses runs where the kind rules
// put it, so a partial backend runs beside a full one with no plan file.
func DefaultPlan(m *Model, devices []core.Device, specs []sched.UnitSpec) (*sched.Plan, error) {
	kinds := make([]core.DeviceKind, len(specs))
	partial := make([]bool, len(specs))
	same, anyPartial := true, false
	mm := core.QueryFor(RepresentativeMatMul(m))
	for i, s := range specs {
		d, err := sched.FindDevice(s, devices)
		if err != nil {
			return nil, err
		}
		kinds[i] = d.Info().Kind
		same = same && kinds[i] == kinds[0]
		partial[i] = len(specs) > 1 && d.OpSupport(mm) == core.VerdictNo
		anyPartial = anyPartial || partial[i]
	}
	if anyPartial {
		// decode shards cut every layer's MATMULs over the units, which a partial one refuses
		return sched.DefaultPlanPartial(specs, kinds, partial, m.Config.Layers), nil
	}
	p := sched.DefaultPlan(specs, kinds, m.Config.Layers)
	if len(specs) < 2 || !same {
		return p, nil
	}
	sh := &sched.Shards{}
	for i := range specs {
		sh.Units = append(sh.Units, strconv.Itoa(i))
	}
	// the nodes outside the shards (residual adds, norms) follow the layer split's rules, as
	// decode did before: a decode phase without rules uses prefill's
	sp := *p
	sp.Decode.Shards = sh
	rp, err := sp.Resolve()
	if err != nil {
		return nil, fmt.Errorf("llm: default plan: %w", err)
	}
	if _, err := m.cutShards(rp.DecodeShards()); err != nil {
		return p, nil // the model cannot be sharded over these units: decode as the layers run
	}
	return &sp, nil
}

// WithoutShards is p without decode shards: for W8A8 weights and the sparse FFN, which shards
// do not run.
func WithoutShards(p *sched.Plan) *sched.Plan {
	if p.Decode.Shards == nil {
		return p
	}
	out := *p
	out.Decode.Shards = nil
	return &out
}

func newRunnerConfig(opts []RunnerOption) runnerConfig {
	cfg := runnerConfig{kv: kvTypes{DefaultKVCacheType, DefaultKVCacheType}, chunk: DefaultChunk, logger: slog.Default()}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.stageChecks = cfg.stageChecks || cfg.logger.Enabled(context.Background(), slog.LevelDebug)
	return cfg
}

func newRunner(ctx context.Context, m *Model, devices []core.Device, plan *sched.Plan, cfg runnerConfig) (*Runner, error) {
	rp, err := plan.Resolve()
	if err != nil {
		return nil, fmt.Errorf("llm: %w", err)
	}
	if plan.Prefill.Chunk > 0 {
		cfg.chunk = plan.Prefill.Chunk
	}
	if cfg.ctxLen == 0 {
		cfg.ctxLen = DefaultContextLength(m)
	}
	if cfg.chunk < 1 || cfg.ctxLen < 1 || cfg.ctxLen > maxContext {
		return nil, fmt.Errorf("llm: chunk %d and context %d must be positive (context at most %d): %w",
			cfg.chunk, cfg.ctxLen, maxContext, core.ErrInvalidArgument)
	}
	if err := checkKVTypes(m, cfg.kv); err != nil {
		return nil, err
	}
	cfg.chunk = min(cfg.chunk, cfg.ctxLen)
	if err := checkVerifyLengths(cfg.verify, cfg.ctxLen); err != nil {
		return nil, err
	}
	// A padded chunk or verify graph writes rows up to its length past the last real token.
	widest := cfg.chunk
	if len(cfg.verify) > 0 {
		widest = max(widest, slices.Max(cfg.verify))
	}
	if cfg.w8 != nil || cfg.sparse != nil || cfg.tap != nil {
		if err := m.RequireLlamaShape("W8A8 weights, the sparse FFN and calibration taps"); err != nil {
			return nil, err
		}
	}
	r := &Runner{m: m, cfg: cfg, plan: rp, progs: map[int]*chunkProg{}, vprogs: map[int]*chunkProg{}, cap: int64(cfg.ctxLen + widest - 1)}
	if ps := rp.DecodeShards(); ps != nil {
		if cfg.w8 != nil || cfg.sparse != nil || cfg.tap != nil {
			return nil, fmt.Errorf("llm: decode shards with W8A8 weights, a sparse FFN or calibration taps: %w",
				core.ErrUnsupported)
		}
		cuts, err := m.cutShards(ps)
		if err != nil {
			return nil, err
		}
		r.shards = cuts[len(cuts)/2]
		if len(cuts) > 1 {
			r.adapt = &shardAdapt{cuts: cuts, cur: len(cuts) / 2}
		}
	}
	if cfg.rt != nil {
		r.rt, r.shared = cfg.rt, true
		names := map[string]int{}
		for i, u := range cfg.rt.Units() {
			names[u.Name()] = i
		}
		for _, s := range rp.Specs {
			i, ok := names[s.String()]
			if !ok {
				return nil, fmt.Errorf("llm: plan unit %s is not one of the runtime's units: %w", s, core.ErrNotFound)
			}
			r.unitIdx = append(r.unitIdx, i)
		}
	} else {
		specs := slices.Clone(rp.Specs)
		for i := range specs {
			for k, v := range cfg.options {
				if _, ok := specs[i].Options[k]; !ok {
					if specs[i].Options == nil {
						specs[i].Options = map[string]string{}
					}
					specs[i].Options[k] = v
				}
			}
			r.unitIdx = append(r.unitIdx, i)
		}
		var err error
		r.rt, err = sched.NewRuntime(ctx, devices, specs, sched.WithRuntimeTrace(cfg.trace),
			sched.WithRuntimeLogger(cfg.logger))
		if err != nil {
			return nil, fmt.Errorf("llm: %w", err)
		}
	}
	if cfg.sparse != nil {
		if err := r.checkSparse(); err != nil {
			return nil, errors.Join(err, r.Close())
		}
	}
	if err := r.init(ctx); err != nil {
		return nil, errors.Join(err, r.Close())
	}
	// every node is placed now: a rule for another model (a layer or node this one lacks) is
	// an error, as a node no rule places is (the sparse FFN's runtime places its own nodes)
	if cfg.sparse != nil {
		return r, nil
	}
	if err := rp.CheckUse(m.Config.Layers); err != nil {
		return nil, errors.Join(fmt.Errorf("llm: %w", err), r.Close())
	}
	return r, nil
}

func (r *Runner) init(ctx context.Context) error {
	c := r.m.Config
	a := r.rt.Arena()
	var err error
	alloc := func(size int64) sched.Span {
		if err != nil {
			return sched.Span{}
		}
		var s sched.Span
		s, err = a.Alloc(size)
		return s
	}
	kRow, vRow := r.cfg.kv.rowBytes(c)
	if r.cfg.slot != nil {
		r.kv, err = r.cfg.slot.cache(r.cap, [2]int64{kRow, vRow})
	}
	for len(r.kv) < c.Layers {
		r.kv = append(r.kv, [2]sched.Span{alloc(r.cap * kRow), alloc(r.cap * vRow)})
	}
	if err != nil {
		return fmt.Errorf("llm: KV cache of %d rows: %w", r.cap, err)
	}
	// Positions, query offsets and RoPE tables depend on the row only: written once, and each
	// chunk's stages are bound at its row.
	r.ids, r.posS, r.qoffS = alloc(4*r.cap), alloc(4*r.cap), alloc(4*r.cap)
	if f := c.RopeFreqFactors; f != nil {
		r.cos, r.sin = alloc(r.cap*int64(len(f))*4), alloc(r.cap*int64(len(f))*4)
	}
	if err != nil {
		return fmt.Errorf("llm: position inputs: %w", err)
	}
	pos := make([]int32, r.cap)
	for i := range pos {
		pos[i] = int32(i)
	}
	copy(a.Bytes(r.posS), core.EncodeI32(pos))
	copy(a.Bytes(r.qoffS), core.EncodeI32(pos))
	if c.RopeFreqFactors != nil {
		cos, sin := c.ropeTables(pos, r.cfg.ctxLen)
		copy(a.Bytes(r.cos), core.EncodeF32(cos))
		copy(a.Bytes(r.sin), core.EncodeF32(sin))
	}
	lengths := r.programLengths()
	total := (len(lengths) + len(r.VerifyLengths())) * (c.Layers + 1)
	if r.adapt != nil {
		total += (len(r.adapt.cuts) - 1) * (c.Layers + 1)
	}
	done := 0
	step := func() {
		done++
		if r.cfg.progress != nil {
			r.cfg.progress(done, total)
		}
	}
	if r.cfg.sparse != nil {
		return r.initSparse(ctx, step, lengths)
	}
	// longest first: a unit's decode parts of a split weight are then rows of the whole weight
	// its prefill graphs uploaded, which the adapter passes as offsets and neon serves out of
	// the one repacked copy (uploaded the other way round, the part comes first and the whole
	// weight is a copy of its own)
	for _, n := range slices.Backward(lengths) {
		t0 := time.Now()
		cp, err := r.prepare(ctx, int64(n), step, false)
		if err != nil {
			return err
		}
		r.progs[n] = cp
		r.cfg.logger.Debug("llm: stage graphs prepared", "program", cp.prog.Name(), "took", time.Since(t0))
	}
	if r.adapt != nil {
		if err := r.adapt.prepare(ctx, r, step); err != nil {
			return err
		}
	}
	return r.prepareVerify(ctx, step)
}

// phaseOf is the plan phase a chunk length serves: the one-token graphs decode (and serve a
// lone prompt token).
func phaseOf(c int64) sched.Phase {
	if c == 1 {
		return sched.PhaseDecode
	}
	return sched.PhasePrefill
}

// layerOf is the layer plan rules see for node n of stage s: its "blk.N." name prefix; the
// embedding counts as layer 0 and the output head as the last layer.
func (r *Runner) layerOf(s int, n *core.Node) int {
	if rest, ok := strings.CutPrefix(n.Name, "blk."); ok {
		if i := strings.IndexByte(rest, '.'); i > 0 {
			if l, err := strconv.Atoi(rest[:i]); err == nil {
				return l
			}
		}
	}
	if s == 0 {
		return 0
	}
	return r.m.Config.Layers - 1
}

// prepare builds every stage for chunk length c, places its nodes by the plan and has sched
// partition, check and prepare them.
func (r *Runner) prepare(ctx context.Context, c int64, step func(), tree bool) (*chunkProg, error) {
	cfg := r.m.Config
	phase := phaseOf(c)
	a := r.rt.Arena()
	kRow, vRow := r.cfg.kv.rowBytes(cfg)
	spec := sched.ProgramSpec{Name: fmt.Sprintf("%s (chunk %d)", phase, c), Phase: phase, Lanes: 1}
	if tree {
		spec.Name = fmt.Sprintf("verify (tree %d)", c)
	}
	var stages []*core.Graph
	var taps []*tapSet
	var shardOf []map[int]int // per stage, a sharded step's node → shard
	var shared [][][]int      // per stage, a stealing sharded step's pieces
	sharded := r.shards != nil && phase == sched.PhaseDecode && c == 1 && !tree
	for s := 0; s <= cfg.Layers; s++ {
		var g *core.Graph
		var err error
		sb := &stageBuild{w8: r.cfg.w8, quant: map[*core.Tensor]*core.Tensor{}, hidden: r.cfg.hidden}
		if r.cfg.tap != nil {
			sb.taps = &tapSet{}
		}
		switch {
		case sharded && s == 0:
			g, err = r.m.buildShardedEmbedStage(r.shards, r.cfg.kv, sb)
		case sharded:
			g, err = r.m.buildShardedLayerStage(s-1, r.cap, r.cfg.kv, r.shards, sb)
		case s == 0:
			g, err = r.m.buildEmbedStage(c, r.cfg.kv, sb)
		default:
			g, err = r.m.buildLayerStage(s-1, c, r.cap, r.cfg.kv, tree, sb)
		}
		if err != nil {
			return nil, err
		}
		stages = append(stages, g)
		taps = append(taps, sb.taps)
		shardOf = append(shardOf, sb.shard)
		shared = append(shared, sb.shared)
	}
	// Which units each stage uses decides the lanes: a prefill split over several units
	// pipelines chunks, each chunk in flight with its own activations.
	units := make([][]int, len(stages))
	fallback := make([][]int, len(stages))
	splits := make([][]*sched.NodeSplit, len(stages))
	used := map[int]bool{}
	for s, g := range stages {
		units[s], fallback[s] = make([]int, len(g.Nodes)), make([]int, len(g.Nodes))
		for i, n := range g.Nodes {
			if sh, ok := shardOf[s][n.ID]; ok {
				u := r.shards.units[sh]
				units[s][i], fallback[s][i] = r.unitIdx[u], -1
				used[u] = true
				continue
			}
			u, fb, sp, err := r.plan.PlaceSplit(phase, r.layerOf(s, n), n)
			if err != nil {
				return nil, fmt.Errorf("llm: %w", err)
			}
			if fb >= 0 {
				fb = r.unitIdx[fb]
			}
			units[s][i], fallback[s][i] = r.unitIdx[u], fb
			if sp == nil {
				used[u] = true
				continue
			}
			if splits[s] == nil {
				splits[s] = make([]*sched.NodeSplit, len(g.Nodes))
			}
			ns := &sched.NodeSplit{Strategy: sp.Strategy, Ratio: sp.Ratio, Lengths: sp.Lengths, Merge: r.unitIdx[u], Steal: sp.Steal,
				Adapt: sp.Adapt}
			for _, su := range sp.Units {
				ns.Units = append(ns.Units, r.unitIdx[su])
				used[su] = true
			}
			splits[s][i] = ns
		}
	}
	if phase == sched.PhasePrefill && len(used) > 1 {
		spec.Lanes = 2
	}
	lanes := func(size int64) ([]sched.Span, error) {
		out := make([]sched.Span, spec.Lanes)
		for l := range out {
			var err error
			if out[l], err = a.Alloc(size); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	// Stage s reads x and q from pair (s+1)%2 of its lane and writes pair s%2: ping-pong, as a
	// stage's input and output must not alias.
	var x, q [2][]sched.Span
	var logits []sched.Span
	var err error
	for i := range 2 {
		if x[i], err = lanes(c * int64(cfg.Dim) * 4); err == nil {
			q[i], err = lanes(c * int64(cfg.Heads*cfg.HeadDim) * 4)
		}
		if err != nil {
			return nil, fmt.Errorf("llm: activations for chunk %d: %w", c, err)
		}
	}
	if logits, err = lanes(c * r.outWidth() * 4); err != nil {
		return nil, fmt.Errorf("llm: logits for chunk %d: %w", c, err)
	}
	half := int64(cfg.RopeDims / 2)
	cp := &chunkProg{c: c, logits: logits, tree: tree}
	if tree {
		sizes := []int64{4 * c, c * c}
		if cfg.RopeFreqFactors != nil {
			sizes = append(sizes, c*half*4, c*half*4)
		}
		spans := make([]sched.Span, 4)
		for i, n := range sizes {
			if spans[i], err = a.Alloc(n); err != nil {
				return nil, fmt.Errorf("llm: verify inputs for length %d: %w", c, err)
			}
		}
		cp.pos, cp.mask, cp.cos, cp.sin = spans[0], spans[1], spans[2], spans[3]
	}
	for s, g := range stages {
		in, out := (s+1)%2, s%2
		byName := map[string]sched.Binding{
			"ids": {Span: r.ids, Stride: 4}, "pos": {Span: r.posS, Stride: 4}, "q_offset": {Span: r.qoffS, Stride: 4},
			"rope_cos": {Span: r.cos, Stride: half * 4}, "rope_sin": {Span: r.sin, Stride: half * 4},
			"x": {Lanes: x[in]}, "q": {Lanes: q[in]},
		}
		if tree {
			byName["pos"], byName["mask"] = sched.Binding{Span: cp.pos}, sched.Binding{Span: cp.mask}
			byName["rope_cos"], byName["rope_sin"] = sched.Binding{Span: cp.cos}, sched.Binding{Span: cp.sin}
		}
		if s > 0 {
			byName["k_cache"], byName["v_cache"] = sched.Binding{Span: r.kv[s-1][0]}, sched.Binding{Span: r.kv[s-1][1]}
		}
		var shardIO [][4]sched.Binding // per shard: its q in, then its q, k and v out
		if sharded {
			if shardIO, err = r.shardBindings(q[in], q[out], s); err != nil {
				return nil, err
			}
			for sh, b := range shardIO {
				byName[shardName("q", sh)] = b[0]
			}
		}
		st := sched.StageSpec{Name: fmt.Sprintf("stage %d", s), Layer: max(s-1, 0), Graph: g, Units: units[s],
			Fallback: fallback[s], Splits: splits[s], Sharded: sharded, Shared: shared[s]}
		if len(st.Shared) > 0 {
			st.SharedUnits = [2]int{r.unitIdx[r.shards.units[0]], r.unitIdx[r.shards.units[1]]}
		}
		if s == 0 {
			st.Name = "embed"
		}
		for _, t := range g.Inputs {
			b, ok := byName[t.Name]
			if !ok {
				return nil, fmt.Errorf("llm: no binding for stage input %q: %w", t.Name, core.ErrInternal)
			}
			st.IO = append(st.IO, b)
		}
		switch {
		case sharded && s < cfg.Layers:
			// each shard's q and its heads of the K and V rows, in place
			st.IO = append(st.IO, sched.Binding{Lanes: x[out]})
			for _, b := range shardIO {
				st.IO = append(st.IO, b[1:]...)
			}
		case s < cfg.Layers:
			// K and V of layer s are written straight into the cache at the chunk's row.
			st.IO = append(st.IO, sched.Binding{Lanes: x[out]}, sched.Binding{Lanes: q[out]},
				sched.Binding{Span: r.kv[s][0], Stride: kRow}, sched.Binding{Span: r.kv[s][1], Stride: vRow})
		default:
			st.IO = append(st.IO, sched.Binding{Lanes: logits})
		}
		if ts := taps[s]; ts != nil {
			for _, t := range ts.tensors {
				l, err := lanes(t.DType.Bytes(t.Shape.NumElements()))
				if err != nil {
					return nil, fmt.Errorf("llm: calibration taps for chunk %d: %w", c, err)
				}
				st.IO = append(st.IO, sched.Binding{Lanes: l})
			}
		}
		spec.Stages = append(spec.Stages, st)
	}
	spec.Progress = step
	if po := r.cfg.phaseOpts[phase]; len(po) > 0 {
		spec.PrepareOptions = map[int]map[string]string{}
		for _, ru := range r.unitIdx {
			if r.rt.Units()[ru].Device().Info().Kind == core.DeviceCPU {
				spec.PrepareOptions[ru] = po
			}
		}
	}
	if r.cfg.stageChecks || r.cfg.tap != nil {
		tapOf := make([]map[string]tapWhat, len(stages))
		for s, ts := range taps {
			if ts == nil {
				continue
			}
			tapOf[s] = map[string]tapWhat{}
			for i, t := range ts.tensors {
				tapOf[s][t.Name] = ts.what[i]
			}
		}
		spec.Check = func(stage int, t *core.Tensor, data []byte) error {
			if w, ok := tapOf[stage][t.Name]; ok {
				r.cfg.tap(w, data)
			}
			if !r.cfg.stageChecks {
				return nil
			}
			return checkFinite(stageName(stage, cfg.Layers), stages[stage], t, data)
		}
	}
	prog, err := r.rt.Compile(ctx, spec)
	if err != nil {
		if r.cfg.analyzeFirst && errors.Is(err, core.ErrUnsupported) && !errors.Is(err, sched.ErrPlanRefused) {
			// every unit's analysis accepted its nodes (Compile analyzes first), then prepare refused
			return nil, fmt.Errorf("llm: %s: %w: %w", spec.Name, ErrRefusedAfterAnalyze, err)
		}
		return nil, fmt.Errorf("llm: %s: %w", spec.Name, err)
	}
	cp.prog = prog
	return cp, nil
}

// Close releases the cache, the prepared graphs and the units. The runner's report and
// placement stay readable; closing twice is a no-op.
func (r *Runner) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	if r.shared {
		var errs []error
		for _, cp := range r.progs {
			if cp.sp != nil {
				for _, p := range cp.sp.programs() {
					errs = append(errs, p.Close())
				}
				continue
			}
			errs = append(errs, cp.prog.Close())
		}
		for _, cp := range r.vprogs {
			errs = append(errs, cp.prog.Close())
		}
		if r.shift != nil {
			errs = append(errs, r.shift.prog.Close())
		}
		if r.adapt != nil {
			for _, cp := range r.adapt.progs {
				if cp != nil && cp != r.progs[1] {
					errs = append(errs, cp.prog.Close())
				}
			}
		}
		return errors.Join(errs...)
	}
	return r.rt.Close()
}

// Model is the model the runner runs.
func (r *Runner) Model() *Model { return r.m }

// Device is the device of the runner's first unit.
func (r *Runner) Device() core.Device { return r.rt.Units()[r.unitIdx[0]].Device() }

// Units are the names of the units the runner runs on, in plan order.
func (r *Runner) Units() []string {
	units := r.rt.Units()
	var out []string
	for _, i := range r.unitIdx {
		out = append(out, units[i].Name())
	}
	return out
}

// Report is the runtime's report: per unit, the tasks run and the time busy, and the bytes
// copied between the arena and units that cannot import it.
func (r *Runner) Report() sched.RuntimeReport { return r.rt.Report() }

// Placement describes which unit runs which ops, per phase.
func (r *Runner) Placement() string {
	var parts []string
	for _, n := range []int{r.cfg.chunk, 1} {
		if cp, ok := r.progs[n]; ok && cp.sp != nil {
			parts = append(parts, fmt.Sprintf("%s (chunk %d): every stage on %s, the FFN as SPARSE_FFN over %d cached bundle rows",
				phaseOf(cp.c), cp.c, r.Units()[0], r.cfg.sparse.Layout().Rows))
		} else if ok {
			parts = append(parts, cp.prog.Placement())
		}
		if r.cfg.chunk == 1 {
			break
		}
	}
	return strings.Join(parts, "\n")
}

// ContextLength is the most tokens the cache holds.
func (r *Runner) ContextLength() int { return r.cfg.ctxLen }

// ChunkSize is the prefill chunk length.
func (r *Runner) ChunkSize() int { return r.cfg.chunk }

// Len is the number of tokens in the cache.
func (r *Runner) Len() int { return r.pos }

// Tokens returns the tokens in the cache.
func (r *Runner) Tokens() []int32 { return append([]int32(nil), r.history...) }

// CachedPrefix is how many leading tokens of ids the cache holds: what WithPromptCache would
// reuse of a prompt encoding to ids. A server with several runners asks each, to send a request
// to the one that has most of its prompt.
func (r *Runner) CachedPrefix(ids []int32) int {
	n := min(len(ids), len(r.history))
	for i := range n {
		if ids[i] != r.history[i] {
			return i
		}
	}
	return n
}

// Reset empties the cache (the prepared graphs stay).
func (r *Runner) Reset() {
	r.pos = 0
	r.history = r.history[:0]
}

// Prefill appends tokens to the sequence in chunks of the prefill length, the last chunk padded
// (padding rows sit past the last real token, so the causal mask hides them), and returns the
// logits after the last token. When the plan splits the model over several units, chunks
// pipeline: chunk i+1's early stages run while chunk i's later ones do.
func (r *Runner) Prefill(ctx context.Context, tokens []int32) ([]float32, error) {
	held, err := r.enterLeaf(ctx)
	if err != nil {
		return nil, err
	}
	defer r.leave(held)
	if r.batch != nil {
		return r.batch.prefill(ctx, r, tokens)
	}
	return r.feed(ctx, tokens, r.progs[r.cfg.chunk], nil)
}

// Decode appends one token and returns the logits for the next.
func (r *Runner) Decode(ctx context.Context, token int32) ([]float32, error) {
	held, err := r.enterLeaf(ctx)
	if err != nil {
		return nil, err
	}
	defer r.leave(held)
	if r.batch != nil {
		return r.batch.decode(ctx, r, token)
	}
	logits, err := r.feed(ctx, []int32{token}, r.progs[1], nil)
	if err == nil && r.adapt != nil {
		r.adapt.observe(r)
	}
	return logits, err
}

// feed runs tokens through cp's graphs and returns the logits after the last token. With each,
// it also hands over the logits after every token (row i: after tokens[i]), and then runs one
// chunk at a time, as a lane's logits are overwritten by the chunk that uses it next.
func (r *Runner) feed(ctx context.Context, tokens []int32, cp *chunkProg, each func(i int, row []byte) error) ([]float32, error) {
	if r.closed {
		return nil, fmt.Errorf("llm: runner is closed: %w", core.ErrBadState)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("llm: no tokens: %w", core.ErrInvalidArgument)
	}
	if r.pos+len(tokens) > r.cfg.ctxLen {
		return nil, fmt.Errorf("%w: %d tokens in the cache + %d new > context length %d",
			ErrContextFull, r.pos, len(tokens), r.cfg.ctxLen)
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= r.m.Config.Vocab {
			return nil, fmt.Errorf("llm: token %d outside the vocabulary of %d: %w", t, r.m.Config.Vocab, core.ErrInvalidArgument)
		}
	}
	// The token ids go to their rows, the padding of a last chunk as id 0 (past the last real
	// token, where the causal mask hides it).
	ids := r.rt.Arena().Bytes(r.ids)
	c := int(cp.c)
	end := r.pos + len(tokens)
	if rem := len(tokens) % c; rem > 1 {
		end += c - rem
	}
	padded := make([]int32, end-r.pos)
	copy(padded, tokens)
	copy(ids[4*r.pos:], core.EncodeI32(padded))

	var chunks []sched.Chunk
	n := len(tokens)
	full := n / c * c
	if n-full > 1 {
		full = n
	}
	for start := 0; start < full; start += c {
		chunks = append(chunks, sched.Chunk{Row: int64(r.pos + start), Index: len(chunks)})
	}
	if cp.sp != nil {
		return r.feedSparse(ctx, tokens, cp, chunks, each)
	}
	V := r.outWidth()
	rowsOf := func(p *chunkProg, lane, from, count int) error {
		b := r.rt.Arena().Bytes(p.logits[lane])
		for i := range count {
			if err := each(from+i, b[int64(i)*V*4:][:V*4]); err != nil {
				return err
			}
		}
		return nil
	}
	if each == nil {
		if err := cp.prog.Run(ctx, chunks); err != nil {
			return nil, fmt.Errorf("llm: %s at position %d: %w", cp.prog.Name(), r.pos, err)
		}
	} else {
		for i, ch := range chunks {
			if err := cp.prog.Run(ctx, []sched.Chunk{ch}); err != nil {
				return nil, fmt.Errorf("llm: %s at position %d: %w", cp.prog.Name(), ch.Row, err)
			}
			if err := rowsOf(cp, 0, i*c, min(c, n-i*c)); err != nil {
				return nil, err
			}
		}
	}
	lastProg, last := cp, len(chunks)-1
	if each != nil {
		last = 0 // every chunk ran alone, on lane 0
	}
	lastRows := n - (len(chunks)-1)*c
	if full < n {
		// a lone last token needs no padded chunk: the decode graphs serve it
		lastProg, last, lastRows = r.progs[1], 0, 1
		if err := lastProg.prog.Run(ctx, []sched.Chunk{{Row: int64(r.pos + full), Index: len(chunks)}}); err != nil {
			return nil, fmt.Errorf("llm: %s at position %d: %w", lastProg.prog.Name(), r.pos+full, err)
		}
		if each != nil {
			if err := rowsOf(lastProg, 0, full, 1); err != nil {
				return nil, err
			}
		}
	}
	row := r.rt.Arena().Bytes(lastProg.logits[last%lastProg.prog.Lanes()])[int64(lastRows-1)*V*4:][:V*4]
	r.pos += n
	r.history = append(r.history, tokens...)
	return core.DecodeF32(row), nil
}
