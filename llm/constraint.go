package llm

import (
	"fmt"
	"math"

	"github.com/xpuhub/xpu/llm/sample"
)

// Constraint restricts the tokens Generate may sample (a grammar, a JSON Schema). Generate
// calls Reset when it starts, Mask on the logits before each sample, Accept with the token
// sampled, and ends with StopEOS once Done. A constraint serves one Generate at a time.
type Constraint interface {
	// Reset returns to the start (Generate calls it first, so a retried request starts over).
	Reset()
	// Mask sets the logits of the tokens that may not come next to -Inf. Stop tokens are to
	// be left only where the output may end. An error (no token may come next) ends
	// generation with it.
	Mask(logits []float32) error
	// Accept advances over the sampled token.
	Accept(id int32) error
	// Done reports that the output is complete and nothing may follow.
	Done() bool
}

// WithConstraint holds generation to c (see Constraint). It cannot be combined with
// speculative decoding (Generate fails with core.ErrInvalidArgument).
func WithConstraint(c Constraint) GenerateOption { return func(g *genConfig) { g.constraint = c } }

// TokenChecker is a Constraint that can tell cheaply whether one token may come next (without
// masking the whole vocabulary). Generate then samples first and masks only when the sample
// is refused.
type TokenChecker interface {
	Allows(id int32) bool
}

// constrained is Generate's sampling under a constraint (nil: plain sampling).
type constrained struct {
	c     Constraint
	check TokenChecker // c's cheap check, nil when it has none or the shortcut would be inexact
	saved []float32
}

func newConstrained(c Constraint, s sample.Config) *constrained {
	if c == nil {
		return nil
	}
	c.Reset()
	h := &constrained{c: c}
	if tc, ok := c.(TokenChecker); ok && !s.Truncates() {
		h.check = tc
	}
	return h
}

// sample picks the next token: without a constraint as the sampler does; with one, held to it
// (masked logits before the draw, Accept after).
func (h *constrained) sample(s *sample.Sampler, logits []float32, history []int32) (int32, error) {
	if h == nil {
		return s.Sample(logits, history), nil
	}
	if h.check != nil {
		// the draw changes logits (penalties): keep them to mask and draw again on refusal
		h.saved = append(h.saved[:0], logits...)
		if next := s.Sample(logits, history); next >= 0 && h.check.Allows(next) {
			return next, h.accept(next)
		}
		copy(logits, h.saved)
	}
	if err := h.c.Mask(logits); err != nil {
		return -1, fmt.Errorf("llm: constraint: %w", err)
	}
	next := s.Sample(logits, history)
	if next >= 0 && math.IsInf(float64(logits[next]), -1) {
		// rounding in the sampler's draw can fall through to a masked token: take the best allowed
		next = sample.Argmax(logits)
	}
	return next, h.accept(next)
}

func (h *constrained) accept(id int32) error {
	if err := h.c.Accept(id); err != nil {
		return fmt.Errorf("llm: constraint: %w", err)
	}
	return nil
}
