package jinja

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// This file is xpu's addition to the engine (see NOTICE): the limits that keep a hostile
// template (a chat template from a model file is untrusted input) from killing or hanging the
// process that renders it. The upstream engine has none: a recursive macro overflowed the Go
// stack (a fatal error, not a panic), range(100000000) or a doubling string exhausted memory,
// and nested loops ran for as long as they liked.

// ErrLimit is wrapped by every error of a render (or compile) that broke a limit.
var ErrLimit = errors.New("jinja: template limit exceeded")

// Limits bound one render. A zero field takes its default.
type Limits struct {
	// MaxDepth bounds how deeply macro and caller() calls nest (recursion).
	MaxDepth int
	// MaxBytes bounds the bytes a render builds: its output plus every string and list
	// built by +, ~ and * (a list item counts 16 bytes).
	MaxBytes int64
	// MaxSteps bounds the nodes and loop iterations a render executes.
	MaxSteps int64
}

// DefaultLimits are far above what real chat templates need (a long conversation renders in
// a few thousand steps and a few times its own size in bytes).
var DefaultLimits = Limits{MaxDepth: 64, MaxBytes: 64 << 20, MaxSteps: 10_000_000}

// maxItems bounds a list built at once (range), maxPad a padding width (indent, tojson's
// indent): both allocate before any budget could see the result.
const (
	maxItems = 1 << 20
	maxPad   = 1 << 10
)

// budget is what a render has left; every evaluator of the render shares it.
type budget struct {
	ctx   context.Context
	lim   Limits
	depth int
	bytes int64
	steps int64
}

func newBudget(ctx context.Context, lim Limits) *budget {
	d := DefaultLimits
	if lim.MaxDepth <= 0 {
		lim.MaxDepth = d.MaxDepth
	}
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = d.MaxBytes
	}
	if lim.MaxSteps <= 0 {
		lim.MaxSteps = d.MaxSteps
	}
	return &budget{ctx: ctx, lim: lim}
}

// ctxEvery is how many steps pass between two looks at the context: often enough to stop
// within a millisecond or so, rarely enough to cost nothing.
const ctxEvery = 1024

// step counts one node or loop iteration and stops the render past MaxSteps or when its
// context ends.
func (b *budget) step() error {
	b.steps++
	if b.steps > b.lim.MaxSteps {
		return fmt.Errorf("jinja: the template ran more than %d steps: %w", b.lim.MaxSteps, ErrLimit)
	}
	if b.steps%ctxEvery == 0 {
		if err := b.ctx.Err(); err != nil {
			return fmt.Errorf("jinja: rendering stopped after %d steps: %w: %w", b.steps, ErrLimit, context.Cause(b.ctx))
		}
	}
	return nil
}

// charge counts n more bytes built.
func (b *budget) charge(n int) error {
	if b.bytes += int64(n); b.bytes > b.lim.MaxBytes {
		return fmt.Errorf("jinja: the template built more than %d bytes: %w", b.lim.MaxBytes, ErrLimit)
	}
	return nil
}

// chargeBinary charges what op on left and right is about to build: a string (+, ~, *) or a
// list (+), refusing it before it is allocated.
func (b *budget) chargeBinary(op string, left, right Value) error {
	size := func(v Value) int64 {
		switch {
		case v.IsString():
			return int64(len(v.AsString()))
		case v.IsList():
			return 16 * int64(v.AsList().Len())
		}
		return 16
	}
	switch op {
	case "~":
		return b.charge64(size(left) + size(right))
	case "+":
		if left.IsString() || right.IsString() || (left.IsList() && right.IsList()) {
			return b.charge64(size(left) + size(right))
		}
	case "*":
		if left.IsString() && right.IsInt() {
			n := right.AsInt()
			if n < 0 {
				n = 0 // Python's 'x' * -1 is ''; strings.Repeat would panic
			}
			per := int64(len(left.AsString()))
			if per > 0 && n > (b.lim.MaxBytes-b.bytes)/per {
				return fmt.Errorf("jinja: a string of %d bytes repeated %d times is over the template's limit of %d bytes: %w",
					per, right.AsInt(), b.lim.MaxBytes, ErrLimit)
			}
			return b.charge64(per * n)
		}
	}
	return nil
}

func (b *budget) charge64(n int64) error {
	if n > b.lim.MaxBytes-b.bytes {
		return fmt.Errorf("jinja: the template built more than %d bytes: %w", b.lim.MaxBytes, ErrLimit)
	}
	b.bytes += n
	return nil
}

// enter counts one more nested macro or caller() call; the caller defers leave.
func (b *budget) enter() error {
	if b.depth++; b.depth > b.lim.MaxDepth {
		b.depth--
		return fmt.Errorf("jinja: macro calls nested more than %d deep (recursion?): %w", b.lim.MaxDepth, ErrLimit)
	}
	return nil
}

func (b *budget) leave() { b.depth-- }

// RenderContext is Render within lim and ctx: a render that breaks a limit, or whose context
// ends, stops with an error wrapping ErrLimit (and the context's cause). A panic inside the
// engine becomes an error too: rendering an untrusted template must never end the process.
func (t *Template) RenderContext(ctx context.Context, data map[string]any, lim Limits) (out string, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = "", fmt.Errorf("jinja: the engine failed on this template: %v", p)
		}
	}()
	vals := make(map[string]Value, len(data))
	for k, v := range data {
		vals[k] = FromGoValue(v)
	}
	return render(t.nodes, vals, newBudget(ctx, lim))
}

// renderTimeout bounds Render and RenderValues, which take no context.
const renderTimeout = 10 * time.Second
