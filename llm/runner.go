package llm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/kvcache"
	"github.com/xpuhub/xpu/sched"
)

// ErrContextFull: the tokens do not fit in the KV cache.
var ErrContextFull = errors.New("llm: context is full")

// Runner holds one sequence's state: the KV cache and the stage graphs for the prefill chunk
// length and for decoding, prepared on the units of a plan through a sched.Runtime (the
// runner builds graphs; sched opens the contexts, prepares the partitions and runs them). It
// is not safe for concurrent use.
//
// Techniques plug into the runner and into Generate at six points, from the finest: a
// ProjectionHook (WithProjectionHook) lowers the projections of every stage graph (package
// w8a8); a StageHook supplies the stage graphs of the decode programs (package shard's decode
// shards, registered with RegisterShards); a ChunkHook (WithChunkHook) runs whole chunks with
// programs of its own, built from the model's blocks (Model.Block; package sparse); a
// SequenceHook (WithSequenceHook) serves Prefill and Decode, several runners' steps at once
// (package batch); a VerifyHook (WithVerifyHook) prepares verify programs that append given
// tokens in one pass with every token's logits (package spec's verify graphs); a Strategy
// (WithStrategy) decodes in place of Generate's own loop (package spec). Every hook reaches the
// runner through its Seam; the runner keeps what they all share: the KV cache, the position
// inputs, activation lanes, placement by the plan, compiling and running.
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
	// vprogs are the programs techniques prepared (Seam.Prepare: verify programs, a batch's
	// short chunk) and verify the verify hook's part of the runner.
	vprogs  []*chunkProg
	verify  any
	shift   *kvcache.Shifter // the context shift's K rotation, prepared at the first shift
	closed  bool
	shared  bool  // rt is the caller's (WithRuntime)
	unitIdx []int // plan unit → runtime unit
	// shards, when the plan shards decode steps, builds and picks the decode programs.
	shards *runnerShards
	pos    int // tokens in the cache
	// history is the tokens in the cache.
	history []int32
	// hook is the chunk hook's part of the runner (WithChunkHook), nil without one.
	hook ChunkPrograms
	// busy is set while a call runs on the runner (busy.go): a second one at the same time
	// fails with ErrBusy.
	busy atomic.Bool
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
	// hp, with a chunk hook (WithChunkHook), replaces prog: the hook's programs.
	hp ChunkProgram
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
// shards, equal shares) when a shard package is registered (RegisterShards: package llm/shard)
// and m's KV heads and weights allow it: the default plan's layer split pipelines prefill chunks
// but runs a decode step on one unit after another, where shards run it on all of them at once. w8a8.Plan and a sparse FFN drop the shards (shard.Without).
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
	if _, err := newShards(m, rp.DecodeShards()); err != nil {
		return p, nil // the model cannot be sharded over these units: decode as the layers run
	}
	return &sp, nil
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
	if err := kvcache.Check(m.Config.HeadDim, cfg.kv); err != nil {
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
	if err := cfg.checkHooks(rp.DecodeShards() != nil); err != nil {
		return nil, err
	}
	if cfg.proj != nil {
		if err := m.RequireLlamaShape("a projection hook (W8A8 weights, calibration)"); err != nil {
			return nil, err
		}
	}
	r := &Runner{m: m, cfg: cfg, plan: rp, progs: map[int]*chunkProg{}, cap: int64(cfg.ctxLen + widest - 1)}
	if ps := rp.DecodeShards(); ps != nil {
		if r.shards, err = newShards(m, ps); err != nil {
			return nil, err
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
	if err := r.init(ctx); err != nil {
		return nil, errors.Join(err, r.Close())
	}
	// every node is placed now: a rule for another model (a layer or node this one lacks) is
	// an error, as a node no rule places is (a chunk hook places its own nodes)
	if cfg.chunkHook != nil {
		return r, nil
	}
	if err := rp.CheckUse(m.Config.Layers); err != nil {
		return nil, errors.Join(fmt.Errorf("llm: %w", err), r.Close())
	}
	return r, nil
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
			if cp.hp != nil {
				errs = append(errs, cp.hp.Close())
				continue
			}
			errs = append(errs, cp.prog.Close())
		}
		for _, cp := range r.vprogs {
			errs = append(errs, cp.prog.Close())
		}
		if r.shift != nil {
			errs = append(errs, r.shift.Close())
		}
		if r.shards != nil {
			for _, cp := range r.shards.progs {
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
		if cp, ok := r.progs[n]; ok && cp.hp != nil {
			parts = append(parts, r.hook.Describe(cp.c))
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

// AppendTokens appends the tokens in the cache to dst: Tokens without a fresh copy each time
// (a decode loop that reads the history every step reuses one buffer).
func (r *Runner) AppendTokens(dst []int32) []int32 { return append(dst, r.history...) }

// Runtime is the runtime the runner's programs run on (its own, or WithRuntime's): its arena
// holds the cache and the activations.
func (r *Runner) Runtime() *sched.Runtime { return r.rt }

// Trace is the trace the runner's runtime records into (WithTrace), nil without one.
func (r *Runner) Trace() *sched.Trace { return r.rt.Trace() }

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
	if r.cfg.seq != nil {
		return r.serve(ctx, func(ctx context.Context) ([]float32, error) { return r.cfg.seq.Prefill(ctx, tokens) })
	}
	held, err := r.enterLeaf(ctx)
	if err != nil {
		return nil, err
	}
	defer r.leave(held)
	return r.feed(ctx, tokens, r.progs[r.cfg.chunk], nil)
}

// Decode appends one token and returns the logits for the next.
func (r *Runner) Decode(ctx context.Context, token int32) ([]float32, error) {
	if r.cfg.seq != nil {
		return r.serve(ctx, func(ctx context.Context) ([]float32, error) { return r.cfg.seq.Decode(ctx, token) })
	}
	held, err := r.enterLeaf(ctx)
	if err != nil {
		return nil, err
	}
	defer r.leave(held)
	if r.shards != nil {
		if r.progs[1], err = r.shards.current(); err != nil {
			return nil, err
		}
	}
	logits, err := r.feed(ctx, []int32{token}, r.progs[1], nil)
	if err == nil {
		r.observeShards()
	}
	return logits, err
}

// feed runs tokens through cp's graphs and returns the logits after the last token. With each,
// it also hands over the logits after every token (row i: after tokens[i]), and then runs one
// chunk at a time, as a lane's logits are overwritten by the chunk that uses it next.
func (r *Runner) feed(ctx context.Context, tokens []int32, cp *chunkProg, each func(i int, row []byte) error) ([]float32, error) {
	if err := r.checkFeed(tokens); err != nil {
		return nil, err
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
	V := r.outWidth()
	rowsOf := func(p *chunkProg, from, count int) error {
		b := r.rt.Arena().Bytes(p.lane(0))
		for i := range count {
			if err := each(from+i, b[int64(i)*V*4:][:V*4]); err != nil {
				return err
			}
		}
		return nil
	}
	if each == nil {
		if err := cp.run(ctx, chunks, n); err != nil {
			return nil, err
		}
	} else {
		for i, ch := range chunks {
			if err := cp.run(ctx, []sched.Chunk{ch}, n-i*c); err != nil {
				return nil, err
			}
			if err := rowsOf(cp, i*c, min(c, n-i*c)); err != nil {
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
		if err := lastProg.run(ctx, []sched.Chunk{{Row: int64(r.pos + full), Index: len(chunks)}}, 1); err != nil {
			return nil, err
		}
		if each != nil {
			if err := rowsOf(lastProg, full, 1); err != nil {
				return nil, err
			}
		}
	}
	row := r.rt.Arena().Bytes(lastProg.lane(last))[int64(lastRows-1)*V*4:][:V*4]
	r.pos += n
	r.history = append(r.history, tokens...)
	return core.DecodeF32(row), nil
}
