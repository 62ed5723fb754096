package serve

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/batch"
)

// newBatch makes the slots of a server with several of them the runners of one batch.Batch:
// concurrent requests then decode in shared steps on one copy of the weights (continuous
// batching) instead of each reading all the weights for its own token. An engine whose
// options a batch does not run (W8A8 weights, a sparse FFN) keeps independent runners.
func (s *Server) newBatch(ctx context.Context) error {
	if s.cfg.parallel < 2 || s.cfg.noBatch {
		return nil
	}
	b, err := batch.New(ctx, s.eng.Model(), s.eng.Device(), s.cfg.parallel, s.eng.RunnerOptions()...)
	if errors.Is(err, core.ErrUnsupported) {
		s.cfg.logger.Debug("serve: independent runners: the engine's options are not batched", "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("serve: a batch of %d: %w", s.cfg.parallel, err)
	}
	s.batch = b
	for _, r := range b.Runners() {
		s.all = append(s.all, &slot{r: r})
	}
	return nil
}

// WithoutBatching gives each of the parallel slots a runner of its own (a copy of the weights
// each, decoding one token per step) instead of decoding them together: for comparing the two.
func WithoutBatching() Option { return func(c *config) { c.noBatch = true } }

// choiceSlots are the runners a request's choices run on: sl, and for n > 1 on a batch, the
// runners free now (up to n in all; never waiting for one, so a busy server runs the choices
// one after another on sl). A free runner that must be rebuilt first stays in the pool.
func (s *Server) choiceSlots(sl *slot, j *job) []*slot {
	held := []*slot{sl}
	if s.batch == nil {
		return held
	}
	for len(held) < j.n {
		extra := s.slots.take(j.prompt)
		if extra == nil {
			break
		}
		if s.stale(extra) {
			s.slots.put(extra)
			break
		}
		held = append(held, extra)
	}
	return held
}

// eachChoice runs choice(k, i) for the n choices, runner k taking choices k, k+len(held), ...
// one after another, all runners at once; a runner stops at the first choice that returns
// false.
func (s *Server) eachChoice(held []*slot, n int, choice func(k, i int) bool) {
	if len(held) == 1 {
		for i := range n {
			if !choice(0, i) {
				return
			}
		}
		return
	}
	var wg sync.WaitGroup
	for k := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := k; i < n; i += len(held) {
				if !choice(k, i) {
					return
				}
			}
		}()
	}
	wg.Wait()
}
