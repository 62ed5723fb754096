package llm

import (
	"context"
	"fmt"
	"time"

	"github.com/xpuhub/xpu/sched"
)

// ChunkHook runs a runner's chunks with programs of its own instead of the stage programs
// (WithChunkHook): the sparse FFN (package sparse) cuts every layer at its FFN and runs its host
// half between the pieces. The runner keeps the KV cache, the position inputs of every chunk,
// chunking and padding, the history and the checks; the hook's programs run on the runner's one
// unit. A hook may serve several runners: Attach makes its part of one.
type ChunkHook interface {
	// Attach checks the hook against the runner (its model, units and options) and prepares
	// what the programs of every chunk length share, before the first Prepare; the programs
	// build and bind with s.
	Attach(ctx context.Context, s *Seam) (ChunkPrograms, error)
}

// ChunkPrograms is a ChunkHook's part of one runner.
type ChunkPrograms interface {
	// Prepare builds and compiles the programs of chunk length c.
	Prepare(ctx context.Context, c int64) (ChunkProgram, error)
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

// initHook attaches the chunk hook and prepares its programs for every chunk length.
func (r *Runner) initHook(ctx context.Context, step func(), lengths []int) error {
	hp, err := r.cfg.chunkHook.Attach(ctx, &Seam{r: r, step: step})
	if err != nil {
		return err
	}
	r.hook = hp
	for _, n := range lengths {
		t0 := time.Now()
		p, err := hp.Prepare(ctx, int64(n))
		if err != nil {
			return err
		}
		r.progs[n] = &chunkProg{c: int64(n), hp: p}
		r.cfg.logger.Debug("llm: chunk hook's programs prepared", "chunk", n, "took", time.Since(t0))
	}
	return nil
}

// run runs chunks through cp, of which the tokens fill the first rows (the rest is padding):
// the stage programs pipeline them over their lanes, a chunk hook's programs run one at a time.
func (cp *chunkProg) run(ctx context.Context, chunks []sched.Chunk, rows int) error {
	if cp.hp == nil {
		if err := cp.prog.Run(ctx, chunks); err != nil && len(chunks) > 0 {
			return fmt.Errorf("llm: %s at position %d: %w", cp.prog.Name(), chunks[0].Row, err)
		}
		return nil
	}
	for i, ch := range chunks {
		if err := cp.hp.Run(ctx, ch.Row, min(int(cp.c), rows-i*int(cp.c))); err != nil {
			return err
		}
	}
	return nil
}

// lane is the span of the logits of the chunk that ran last on lane l.
func (cp *chunkProg) lane(l int) sched.Span {
	if cp.hp != nil {
		return cp.hp.Logits()
	}
	return cp.logits[l%cp.prog.Lanes()]
}
