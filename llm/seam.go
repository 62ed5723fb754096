package llm

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/kvcache"
	"github.com/xpuhub/xpu/sched"
)

// Seam is a runner as the technique plugged into it sees it: the runner hands one to every hook
// it calls (ChunkHook, StageHook, SequenceHook, VerifyHook). Through it a technique binds the
// runner's cache and position inputs, compiles one-stage programs of its own on the runner's
// unit, prepares and runs the runner's stage programs of a chunk length (optionally
// tree-masked), checks and records tokens it ran itself, and keeps the rows of an accepted
// draft. The runner keeps the cache, the positions, the history and the checks.
type Seam struct {
	r *Runner
	// step reports one more stage graph prepared (WithProgress), while NewRunner prepares.
	step func()
}

// Runner is the runner the technique plugs into.
func (s *Seam) Runner() *Runner { return s.r }

// Logger is the runner's logger (WithLogger).
func (s *Seam) Logger() *slog.Logger { return s.r.cfg.logger }

// PhaseOptions are the prepare options of phase p's programs on a CPU unit (WithPhaseOptions),
// which a technique's programs of that phase take too.
func (s *Seam) PhaseOptions(p sched.Phase) map[string]string { return s.r.cfg.phaseOpts[p] }

// Step reports one more stage graph prepared (WithProgress).
func (s *Seam) Step() {
	if s.step != nil {
		s.step()
	}
}

// KVTypes are the dtypes of the K and V caches.
func (s *Seam) KVTypes() kvcache.Types { return s.r.cfg.kv }

// Capacity is the cache's rows: the context and the padding of the longest chunk (a chunk's
// attention reads them all, masked).
func (s *Seam) Capacity() int64 { return s.r.cap }

// KV binds layer l's K and V cache as a stage's inputs ("k_cache", "v_cache") or, with rows
// set, as outputs written at the chunk's row.
func (s *Seam) KV(l int, rows bool) (k, v sched.Binding) {
	k, v = sched.Binding{Span: s.r.kv[l][0]}, sched.Binding{Span: s.r.kv[l][1]}
	if rows {
		k.Stride, v.Stride = s.r.cfg.kv.RowBytes(s.r.m.Config)
	}
	return k, v
}

// bindInputs binds each input of stage graph g (named stage in errors) by its name in byName.
func bindInputs(g *core.Graph, stage string, byName map[string]sched.Binding) ([]sched.Binding, error) {
	io := make([]sched.Binding, 0, len(g.Inputs))
	for _, t := range g.Inputs {
		b, ok := byName[t.Name]
		if !ok {
			return nil, fmt.Errorf("llm: no binding for input %q of %s: %w", t.Name, stage, core.ErrInternal)
		}
		io = append(io, b)
	}
	return io, nil
}

// positions are the runner's position inputs by name, bound at each chunk's row.
func (r *Runner) positions() map[string]sched.Binding {
	half := int64(r.m.Config.RopeDims / 2)
	return map[string]sched.Binding{
		"ids": {Span: r.ids, Stride: 4}, "pos": {Span: r.posS, Stride: 4}, "q_offset": {Span: r.qoffS, Stride: 4},
		"rope_cos": {Span: r.cos, Stride: half * 4}, "rope_sin": {Span: r.sin, Stride: half * 4},
	}
}

// Compile compiles the one-stage program name of graph g, for chunks of length c, on the
// runner's unit: each input is bound by name, from byName or the runner's position inputs (ids,
// pos, q_offset, rope_cos, rope_sin), and the outputs to outs. The program takes the phase of
// the chunk length, its prepare options (WithPhaseOptions) and the stage checks
// (WithStageChecks).
func (s *Seam) Compile(ctx context.Context, c int64, name string, layer int, g *core.Graph, byName map[string]sched.Binding, outs ...sched.Binding) (*sched.Program, error) {
	r := s.r
	unit := r.unitIdx[0]
	units := make([]int, len(g.Nodes))
	for i := range units {
		units[i] = unit
	}
	all := r.positions()
	maps.Copy(all, byName)
	in, err := bindInputs(g, name, all)
	if err != nil {
		return nil, err
	}
	st := sched.StageSpec{Name: name, Layer: layer, Graph: g, Units: units, IO: append(in, outs...)}
	phase := phaseOf(c)
	spec := sched.ProgramSpec{Name: fmt.Sprintf("%s (chunk %d)", name, c), Phase: phase, Lanes: 1,
		Stages: []sched.StageSpec{st}}
	if po := r.cfg.phaseOpts[phase]; len(po) > 0 {
		spec.PrepareOptions = map[int]map[string]string{unit: po}
	}
	if r.cfg.stageChecks {
		spec.Check = r.finiteCheck([]*core.Graph{g}, func(int) string { return name }).Check
	}
	p, err := r.rt.Compile(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("llm: %s: %w", spec.Name, err)
	}
	return p, nil
}

// Prepare compiles a new set of the runner's stage programs of chunk length c, which the cache
// must have room to pad (at most the prefill chunk or one of the verify hook's lengths). With
// tree, each row attends to the cache before the chunk and to the rows of the chunk its mask row
// sets, at the position Program.Run gives it (a draft tree's node sees its ancestors); a unit
// that refuses the mask fails with core.ErrUnsupported. Without, rows attend causally. The
// runner's Close releases the programs.
func (s *Seam) Prepare(ctx context.Context, c int, tree bool) (*Program, error) {
	r := s.r
	ctx, leave, err := r.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	if c < 1 || c > r.cfg.chunk && !slices.Contains(r.cfg.verify, c) {
		return nil, fmt.Errorf("llm: programs of chunk length %d: the cache pads chunks of 1 to %d and the verify lengths %v: %w",
			c, r.cfg.chunk, r.cfg.verify, core.ErrInvalidArgument)
	}
	t0 := time.Now()
	cp, err := r.prepare(ctx, int64(c), s.Step, tree)
	if err != nil {
		return nil, err
	}
	r.vprogs = append(r.vprogs, cp)
	r.cfg.logger.Debug("llm: stage graphs prepared", "program", cp.prog.Name(), "took", time.Since(t0))
	return &Program{r: r, cp: cp}, nil
}

// Program is the runner's own programs of chunk length c: 1 (decoding) or the prefill chunk.
func (s *Seam) Program(c int) (*Program, error) {
	cp, ok := s.r.progs[c]
	if !ok || cp.hp != nil {
		return nil, fmt.Errorf("llm: the runner has no stage programs of chunk length %d (1 and %d): %w", c, s.r.cfg.chunk, core.ErrInvalidArgument)
	}
	return &Program{r: s.r, cp: cp, own: true}, nil
}

// Check is Program.Run's check of tokens, for tokens a technique runs through programs of its
// own: the runner is open, there are some, and they fit in the cache and in the vocabulary.
func (s *Seam) Check(tokens []int32) error { return s.r.checkFeed(tokens) }

// Commit records tokens, which the technique's own programs ran, as the next in the cache: their
// K and V rows are written at the runner's positions from Runner.Len on.
func (s *Seam) Commit(tokens []int32) {
	s.r.pos += len(tokens)
	s.r.history = append(s.r.history, tokens...)
}

// KeepRows keeps, of the cache rows from base on, those at keep (offsets from base, ascending
// from 0: a tree verify's accepted path), moved to rows base, base+1, ... on every unit
// (sched.Runtime.CompactKV), and drops the rest.
func (s *Seam) KeepRows(ctx context.Context, base int, keep []int) error {
	r := s.r
	ctx, leave, err := r.enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	if base < 0 || len(keep) == 0 || keep[0] != 0 || base+keep[len(keep)-1] >= r.pos {
		return fmt.Errorf("llm: keep rows %v from %d: the cache holds %d: %w", keep, base, r.pos, core.ErrInvalidArgument)
	}
	if err := r.compactKV(ctx, int64(base), keep); err != nil {
		return err
	}
	for i, k := range keep {
		r.history[base+i] = r.history[base+k]
	}
	r.pos = base + len(keep)
	r.history = r.history[:r.pos]
	return nil
}

// Program is one set of the runner's stage programs of a chunk length (Seam.Prepare,
// Seam.Program).
type Program struct {
	r   *Runner
	cp  *chunkProg
	own bool // one of the runner's own (Seam.Program), which its Close releases
}

// Len is the program's chunk length: the most tokens one Run takes.
func (p *Program) Len() int { return int(p.cp.c) }

// Tree says the program takes a tree mask.
func (p *Program) Tree() bool { return p.cp.tree }

// Close releases a program Seam.Prepare made before the runner's Close does; the runner's own
// programs (Seam.Program) are the runner's to release.
func (p *Program) Close() error {
	if p.own {
		return fmt.Errorf("llm: %s is the runner's own program: %w", p.cp.prog.Name(), core.ErrInvalidArgument)
	}
	return p.cp.prog.Close()
}

// Run appends tokens, at most Len, to the cache in one pass and returns the logits after the
// last; with each, it also hands over the logits after every token (row i predicts the token
// after tokens[i]; F32 bytes, valid during the call only). A tree program takes each row's
// position as an offset from the cache's length (pos, Len of them) and the mask (Len × Len
// bytes, row i's ones the rows it attends to; a padding row should see itself); a causal one
// takes nil for both. More tokens than the context has room for is an error and changes
// nothing.
func (p *Program) Run(ctx context.Context, tokens, pos []int32, mask []byte, each func(i int, row []byte) error) ([]float32, error) {
	r, cp, c := p.r, p.cp, int(p.cp.c)
	ctx, leave, err := r.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	if len(tokens) > c || cp.tree != (pos != nil) || pos != nil && (len(pos) != c || len(mask) != c*c) {
		return nil, fmt.Errorf("llm: run of %d tokens with %d positions and a mask of %d on the program of length %d (tree mask %v): %w",
			len(tokens), len(pos), len(mask), c, cp.tree, core.ErrInvalidArgument)
	}
	if pos != nil {
		a := r.rt.Arena()
		abs := make([]int32, c)
		for i, o := range pos {
			abs[i] = int32(r.pos) + o
		}
		copy(a.Bytes(cp.mask)[:c*c], mask)
		copy(a.Bytes(cp.pos), core.EncodeI32(abs))
		if r.m.Config.RopeFreqFactors != nil {
			cos, sin := r.m.Config.RopeTables(abs, r.cfg.ctxLen)
			copy(a.Bytes(cp.cos), core.EncodeF32(cos))
			copy(a.Bytes(cp.sin), core.EncodeF32(sin))
		}
	}
	return r.feed(ctx, tokens, cp, each)
}

// checkFeed is feed's argument check.
func (r *Runner) checkFeed(tokens []int32) error {
	if r.closed {
		return fmt.Errorf("llm: runner is closed: %w", core.ErrBadState)
	}
	if r.pos+len(tokens) > r.cfg.ctxLen {
		return fmt.Errorf("%w: %d tokens in the cache + %d new > context length %d",
			ErrContextFull, r.pos, len(tokens), r.cfg.ctxLen)
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= r.m.Config.Vocab {
			return fmt.Errorf("llm: token %d outside the vocabulary of %d: %w", t, r.m.Config.Vocab, core.ErrInvalidArgument)
		}
	}
	if len(tokens) == 0 {
		return fmt.Errorf("llm: no tokens: %w", core.ErrInvalidArgument)
	}
	return nil
}

// checkHooks refuses hooks and outputs that do not combine (core.ErrUnsupported): of each pair,
// one builds or runs the stage graphs in a way the other does not know. shards says the plan
// shards decode steps (a StageHook).
func (c *runnerConfig) checkHooks(shards bool) error {
	type use struct {
		on   bool
		name string
	}
	proj, chunk := use{c.proj != nil, "a projection hook (W8A8 weights, calibration)"}, use{c.chunkHook != nil, "a chunk hook (the sparse FFN)"}
	verify, hidden := use{len(c.verify) > 0, "verify lengths"}, use{c.hidden, "hidden-state output"}
	seq, shard := use{c.seq != nil, "a sequence hook (a batch)"}, use{shards, "decode shards"}
	for _, p := range [][2]use{
		{hidden, proj}, {hidden, chunk}, {hidden, verify},
		{chunk, proj}, {chunk, verify},
		{seq, proj}, {seq, chunk}, {seq, verify}, {seq, hidden},
		{shard, proj}, {shard, chunk},
	} {
		if p[0].on && p[1].on {
			return fmt.Errorf("llm: %s does not combine with %s: %w", p[0].name, p[1].name, core.ErrUnsupported)
		}
	}
	return nil
}
