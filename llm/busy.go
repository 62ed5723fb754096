package llm

import (
	"context"
	"errors"
)

// ErrBusy: a Runner was called while another call was still running on it, e.g. from two
// goroutines at once. A Runner holds one sequence; sharing it would mix two sequences' tokens in
// one KV cache and corrupt both texts, so the second call fails instead.
var ErrBusy = errors.New("llm: the runner is in use by another call (a Runner is not safe for concurrent use; make one per goroutine with Engine.NewRunner)")

// busyKey marks a context as inside a call that holds r, so that the calls it makes on r
// (Generate's Prefill and Decode) pass the guard.
type busyKey struct{ r *Runner }

// enter claims r for a call on ctx and returns the context its nested calls run on and the
// function that gives r back. A call nested in one that holds r passes through.
func (r *Runner) enter(ctx context.Context) (context.Context, func(), error) {
	if ctx.Value(busyKey{r}) != nil {
		return ctx, func() {}, nil
	}
	if !r.busy.CompareAndSwap(false, true) {
		return ctx, nil, ErrBusy
	}
	return context.WithValue(ctx, busyKey{r}, r), func() { r.busy.Store(false) }, nil
}

// enterLeaf is enter for calls that make no nested calls on r (Prefill, Decode): it allocates
// no context, so that a decode loop stays free of allocations. held says whether the caller
// must give r back (leave).
func (r *Runner) enterLeaf(ctx context.Context) (held bool, err error) {
	if ctx.Value(busyKey{r}) != nil {
		return false, nil
	}
	if !r.busy.CompareAndSwap(false, true) {
		return false, ErrBusy
	}
	return true, nil
}

// leave gives r back after enterLeaf claimed it.
func (r *Runner) leave(held bool) {
	if held {
		r.busy.Store(false)
	}
}
