package llm

import (
	"context"

	"github.com/xpuhub/xpu/sched"
)

// SequenceHook serves a runner's Prefill and Decode in its place (WithSequenceHook): continuous
// batching (package batch) runs the tokens of several runners as shared steps over one copy of
// the weights. The runner keeps its programs, positions, history and checks; the hook runs
// tokens through the runner's programs (Seam.Program, Seam.Prepare), or through programs of its
// own over the cache it gave the runner and then records them (Seam.Commit).
type SequenceHook interface {
	// Attach hands the hook the runner's seam before the runner prepares its programs, and
	// returns the runner's K and V cache per layer: s.Capacity() rows of the K and V row bytes
	// of s.KVTypes() each, in the arena of the runner's runtime (nil: a cache of the runner's
	// own). A runner retried with another cache dtype attaches again, on a new runtime.
	Attach(s *Seam) ([][2]sched.Span, error)
	// Prefill serves Runner.Prefill.
	Prefill(ctx context.Context, tokens []int32) ([]float32, error)
	// Decode serves Runner.Decode.
	Decode(ctx context.Context, token int32) ([]float32, error)
}

// WithSequenceHook has h serve the runner's Prefill and Decode over a cache h gives. It does not
// combine with a projection hook, a chunk hook, taps, verify lengths or hidden-state output
// (core.ErrUnsupported): the hook's programs are built from the model's own blocks.
func WithSequenceHook(h SequenceHook) RunnerOption { return func(c *runnerConfig) { c.seq = h } }

// serve has the sequence hook serve a Prefill or Decode (f) on a context that holds the runner:
// the hook runs the runner's programs with it, from whichever goroutine runs the step.
func (r *Runner) serve(ctx context.Context, f func(context.Context) ([]float32, error)) ([]float32, error) {
	ctx, leave, err := r.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	return f(ctx)
}
