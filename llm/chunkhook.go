package llm

import (
	"context"
	"fmt"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/kvcache"
	"github.com/xpuhub/xpu/sched"
)

// ChunkHook runs a runner's chunks with programs of its own instead of the stage programs
// (WithChunkHook): the sparse FFN (package sparse) cuts every layer at its FFN and runs its host
// half between the pieces. The runner keeps the KV cache, the position inputs of every chunk,
// chunking and padding, the history and the checks; the hook's programs run on the runner's one
// unit. A hook may serve several runners: Attach makes its part of one.
type ChunkHook interface {
	// Attach checks the hook against r (its model, units and options) and prepares what the
	// programs of every chunk length share, before the first Prepare.
	Attach(ctx context.Context, r *Runner) (ChunkPrograms, error)
}

// ChunkPrograms is a ChunkHook's part of one runner.
type ChunkPrograms interface {
	// Prepare builds and compiles the programs of chunk length s.C.
	Prepare(ctx context.Context, s *ChunkStage) (ChunkProgram, error)
	// Describe is the placement line of chunk length c's programs (Runner.Placement).
	Describe(c int64) string
}

// ChunkProgram is a ChunkHook's programs for one chunk length.
type ChunkProgram interface {
	// Run runs the chunk at cache row row, whose first rows are real tokens (the rest padding).
	Run(ctx context.Context, row int64, rows int) error
	// Logits is the span of the chunk's [C, vocabulary] F32 logits after Run.
	Logits() sched.Span
	// Close releases the programs.
	Close() error
}

// WithChunkHook runs the runner's chunks with h's programs. The runner then runs on one unit
// and does not combine with verify lengths, a projection hook, hidden-state output or a
// batch (core.ErrUnsupported).
func WithChunkHook(h ChunkHook) RunnerOption { return func(c *runnerConfig) { c.chunkHook = h } }

// ChunkPrograms is the runner's part of its ChunkHook, nil without one.
func (r *Runner) ChunkPrograms() ChunkPrograms { return r.hook }

// ChunkStage is what the programs of one chunk length build and bind with.
type ChunkStage struct {
	// C is the chunk length.
	C    int64
	r    *Runner
	step func()
}

// KVTypes are the dtypes of the K and V caches.
func (s *ChunkStage) KVTypes() kvcache.Types { return s.r.cfg.kv }

// Capacity is the cache's rows (a chunk's attention reads them all, masked).
func (s *ChunkStage) Capacity() int64 { return s.r.cap }

// KV binds layer l's K and V cache as a stage's inputs ("k_cache", "v_cache") or, with rows
// set, as outputs written at the chunk's row.
func (s *ChunkStage) KV(l int, rows bool) (k, v sched.Binding) {
	k, v = sched.Binding{Span: s.r.kv[l][0]}, sched.Binding{Span: s.r.kv[l][1]}
	if rows {
		k.Stride, v.Stride = s.r.cfg.kv.RowBytes(s.r.m.Config)
	}
	return k, v
}

// Step reports one more stage graph prepared (WithProgress).
func (s *ChunkStage) Step() { s.step() }

// Compile compiles the one-stage program name of graph g on the runner's unit: each input is
// bound by name, from byName or the runner's position inputs (ids, pos, q_offset, rope_cos,
// rope_sin), and the outputs to outs. The program takes the phase of the chunk length, its
// prepare options (WithPhaseOptions) and the stage checks (WithStageChecks).
func (s *ChunkStage) Compile(ctx context.Context, name string, layer int, g *core.Graph, byName map[string]sched.Binding, outs ...sched.Binding) (*sched.Program, error) {
	r := s.r
	unit := r.unitIdx[0]
	units := make([]int, len(g.Nodes))
	for i := range units {
		units[i] = unit
	}
	half := int64(r.m.Config.RopeDims / 2)
	own := map[string]sched.Binding{
		"ids": {Span: r.ids, Stride: 4}, "pos": {Span: r.posS, Stride: 4}, "q_offset": {Span: r.qoffS, Stride: 4},
		"rope_cos": {Span: r.cos, Stride: half * 4}, "rope_sin": {Span: r.sin, Stride: half * 4},
	}
	st := sched.StageSpec{Name: name, Layer: layer, Graph: g, Units: units}
	for _, t := range g.Inputs {
		b, ok := byName[t.Name]
		if !ok {
			b, ok = own[t.Name]
		}
		if !ok {
			return nil, fmt.Errorf("llm: no binding for stage input %q of %s: %w", t.Name, name, core.ErrInternal)
		}
		st.IO = append(st.IO, b)
	}
	st.IO = append(st.IO, outs...)
	phase := phaseOf(s.C)
	spec := sched.ProgramSpec{Name: fmt.Sprintf("%s (chunk %d)", name, s.C), Phase: phase, Lanes: 1,
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

// initHook attaches the chunk hook and prepares its programs for every chunk length.
func (r *Runner) initHook(ctx context.Context, step func(), lengths []int) error {
	hp, err := r.cfg.chunkHook.Attach(ctx, r)
	if err != nil {
		return err
	}
	r.hook = hp
	for _, n := range lengths {
		t0 := time.Now()
		p, err := hp.Prepare(ctx, &ChunkStage{C: int64(n), r: r, step: step})
		if err != nil {
			return err
		}
		r.progs[n] = &chunkProg{c: int64(n), hp: p}
		r.cfg.logger.Debug("llm: chunk hook's programs prepared", "chunk", n, "took", time.Since(t0))
	}
	return nil
}

// feedHook is feed for a chunk hook's programs: chunks are cp's chunks of tokens (their ids
// written already); a lone last token runs on the one-token programs.
func (r *Runner) feedHook(ctx context.Context, tokens []int32, cp *chunkProg, chunks []sched.Chunk, each func(i int, row []byte) error) ([]float32, error) {
	V := int64(r.m.Config.Vocab)
	n, done, lastRows := len(tokens), 0, 0
	var last ChunkProgram
	runAt := func(p ChunkProgram, row int64, rows int) error {
		if err := p.Run(ctx, row, rows); err != nil {
			return err
		}
		if each != nil {
			b := r.rt.Arena().Bytes(p.Logits())
			for i := range rows {
				if err := each(done+i, b[int64(i)*V*4:][:V*4]); err != nil {
					return err
				}
			}
		}
		last, lastRows = p, rows
		done += rows
		return nil
	}
	for _, ch := range chunks {
		if err := runAt(cp.hp, ch.Row, min(int(cp.c), n-done)); err != nil {
			return nil, err
		}
	}
	if done < n {
		if err := runAt(r.progs[1].hp, int64(r.pos+done), 1); err != nil {
			return nil, err
		}
	}
	row := r.rt.Arena().Bytes(last.Logits())[int64(lastRows-1)*V*4:][:V*4]
	r.pos += n
	r.history = append(r.history, tokens...)
	return core.DecodeF32(row), nil
}
