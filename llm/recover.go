package llm

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/xpuhub/xpu/core"
)

// Backends are the backends the engine opened and keeps (the loader's Stats gives an isolated
// one's process and restarts).
func (e *Engine) Backends() []core.Backend { return slices.Clone(e.backends) }

// Device is the device the engine's runners run on.
func (e *Engine) Device() core.Device { return e.dev }

// Healthy says whether the engine's backends can still answer: nil, or an error wrapping
// core.ErrBackendCrashed once an isolated backend's process has died (core.Liveness), even
// before a generation noticed. It makes no call to the backend and is cheap.
func (e *Engine) Healthy() error {
	var errs []error
	for _, b := range e.backends {
		errs = append(errs, core.Alive(b))
	}
	return errors.Join(errs...)
}

// RestartBackends starts a fresh process for each isolated backend of the engine
// (core.Restarter), the way back after core.ErrBackendCrashed. What was made from the old
// processes stays broken: rebuild the engine's runner (RebuildRunner) and close and replace
// every runner made by NewRunner. An in-process backend cannot restart (its crash ended the
// process): the error then wraps core.ErrUnsupported.
func (e *Engine) RestartBackends(ctx context.Context) error {
	restarted := 0
	for _, b := range e.backends {
		rs, ok := b.(core.Restarter)
		if !ok {
			continue
		}
		if err := rs.Restart(ctx); err != nil {
			return fmt.Errorf("llm: restart backend %s: %w", b.Info().Name, err)
		}
		restarted++
	}
	if restarted == 0 {
		return fmt.Errorf("llm: no backend of the engine can restart (only isolated ones can): %w", core.ErrUnsupported)
	}
	return nil
}

// RebuildRunner replaces the engine's runner by a fresh one on the same device with the same
// options, after RestartBackends; the old runner is closed and its sequence lost. On an error
// the old runner stays in place (and broken); calling RebuildRunner again retries.
func (e *Engine) RebuildRunner(ctx context.Context) error {
	if e.Runner == nil {
		return fmt.Errorf("llm: engine is closed: %w", core.ErrBadState)
	}
	_ = e.Runner.Close() // a crashed backend cannot release what it held: nothing to report
	r, err := NewRunner(ctx, e.Model(), e.dev, e.opts...)
	if err != nil {
		return fmt.Errorf("llm: rebuild the runner: %w", err)
	}
	e.Runner = r
	return nil
}
