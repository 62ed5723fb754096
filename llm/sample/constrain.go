package sample

import (
	"fmt"
	"math"
)

// Constraint restricts the tokens a sampler may pick (a grammar, a JSON Schema: package
// grammar's TokenMatcher). Constrain calls Reset, Constrained.Sample calls Mask on the logits
// before a draw and Accept with the token drawn, and the caller ends the output once Done. A
// constraint serves one generation at a time.
type Constraint interface {
	// Reset returns to the start (Constrain calls it, so a retried request starts over).
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

// TokenChecker is a Constraint that can tell cheaply whether one token may come next (without
// masking the whole vocabulary). Constrained.Sample then draws first and masks only when the
// draw is refused.
type TokenChecker interface {
	Allows(id int32) bool
}

// Constrained is a sampler held to a constraint (Constrain).
type Constrained struct {
	s     *Sampler
	c     Constraint // nil: plain sampling
	check TokenChecker
	saved []float32
}

// Constrain holds s to c, which it resets: Sample then draws only tokens c allows. The
// draw-first shortcut of a TokenChecker is taken only when the sampler keeps the whole
// distribution (Config.Truncates), where it is exact. A nil c samples as s does.
func Constrain(s *Sampler, c Constraint) *Constrained {
	h := &Constrained{s: s, c: c}
	if c == nil {
		return h
	}
	c.Reset()
	if tc, ok := c.(TokenChecker); ok && !s.cfg.Truncates() {
		h.check = tc
	}
	return h
}

// Sample picks the next token as the sampler does, held to the constraint (the logits masked
// before the draw, the token accepted after it); logits is modified. A constraint's error is
// returned wrapped.
func (h *Constrained) Sample(logits []float32, history []int32) (int32, error) {
	if h.c == nil {
		return h.s.Sample(logits, history), nil
	}
	if h.check != nil {
		// the draw changes logits (penalties): keep them to mask and draw again on refusal
		h.saved = append(h.saved[:0], logits...)
		if next := h.s.Sample(logits, history); next >= 0 && h.check.Allows(next) {
			return next, h.accept(next)
		}
		copy(logits, h.saved)
	}
	if err := h.c.Mask(logits); err != nil {
		return -1, fmt.Errorf("constraint: %w", err)
	}
	next := h.s.Sample(logits, history)
	if next >= 0 && math.IsInf(float64(logits[next]), -1) {
		// rounding in the sampler's draw can fall through to a masked token: take the best allowed
		next = Argmax(logits)
	}
	return next, h.accept(next)
}

// Done reports that the constraint is complete and nothing may follow (false without one).
func (h *Constrained) Done() bool { return h.c != nil && h.c.Done() }

func (h *Constrained) accept(id int32) error {
	if err := h.c.Accept(id); err != nil {
		return fmt.Errorf("constraint: %w", err)
	}
	return nil
}
