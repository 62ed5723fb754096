package serve

import (
	"context"
	"errors"
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// newBatch makes the slots of a server with several of them the runners of one llm.Batch:
// concurrent requests then decode in shared steps on one copy of the weights (continuous
// batching) instead of each reading all the weights for its own token. An engine whose
// options a batch does not run (W8A8 weights, a sparse FFN) keeps independent runners.
func (s *Server) newBatch(ctx context.Context) error {
	if s.cfg.parallel < 2 || s.cfg.noBatch {
		return nil
	}
	b, err := s.eng.NewBatch(ctx, s.cfg.parallel)
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
