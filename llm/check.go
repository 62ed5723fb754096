package llm

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
)

// ErrNonFinite: the model computed a NaN or an infinity (corrupt weights or hyperparameters, or
// a backend's numerical bug). Without this check such logits sample as token 0 or a stop token
// and generation ends with empty text and no error.
var ErrNonFinite = errors.New("llm: non-finite values")

// firstNonFinite returns the index of the first NaN or infinity in xs, or -1. x-x is 0 for
// every finite x and NaN otherwise: one comparison per logit, as this runs on every token.
func firstNonFinite(xs []float32) int {
	for i, x := range xs {
		if x-x != 0 {
			return i
		}
	}
	return -1
}

// CheckLogits fails with ErrNonFinite when logits of position pos hold a NaN or an infinity:
// the check every Generate makes (the logits of one position are a few
// thousand floats, so it costs nothing next to the step that made them).
func CheckLogits(logits []float32, pos int) error {
	if i := firstNonFinite(logits); i >= 0 {
		return fmt.Errorf("%w: logit %d of position %d is %g (XPU_LOG=debug or llm.WithStageChecks "+
			"names the first stage that computes one)", ErrNonFinite, i, pos, logits[i])
	}
	return nil
}

// WithStageChecks makes the runner read back every stage's outputs after each run and fail with
// ErrNonFinite naming the first stage (the embedding or a layer), output and element that is
// not finite: a debugging aid, as it reads every activation back to the host. Debug logging
// (the runner's logger enabled at slog.LevelDebug, as with XPU_LOG=debug in xpu) turns it on too.
func WithStageChecks() RunnerOption { return func(c *runnerConfig) { c.stageChecks = true } }

// stageName is how errors name stage s: stage 0 embeds, stage l+1 finishes layer l.
func stageName(s, layers int) string {
	switch {
	case s == 0:
		return "stage 0 (embedding, layer 0's q/k/v)"
	case s == layers:
		return fmt.Sprintf("stage %d (layer %d, output head)", s, s-1)
	}
	return fmt.Sprintf("stage %d (layer %d)", s, s-1)
}

// outputRole names tensor t of stage graph g: x, q, k or v (the stage outputs' order,
// arch.Stage), logits, or "intermediate" for a tensor that only crosses partitions inside the
// stage.
func outputRole(g *core.Graph, t *core.Tensor) string {
	for i, o := range g.Outputs {
		if o.Name != t.Name {
			continue
		}
		if len(g.Outputs) == 1 {
			return "logits"
		}
		if roles := [...]string{"x", "q", "k", "v"}; i < len(roles) {
			return roles[i]
		}
		return fmt.Sprint(i)
	}
	return "intermediate"
}

// checkFinite fails with ErrNonFinite naming the stage, the output and the first bad element
// when data (tensor t's bytes of stage graph g, F32 or F16) holds a NaN or an infinity.
func checkFinite(stage string, g *core.Graph, t *core.Tensor, data []byte) error {
	if t.DType != core.F32 && t.DType != core.F16 {
		return nil
	}
	xs, err := core.Dequantize(t.DType, data, 0)
	if err != nil {
		return fmt.Errorf("llm: %s: output %s: %w", stage, t.Name, err)
	}
	if j := firstNonFinite(xs); j >= 0 {
		row := int64(1)
		if len(t.Shape) > 0 {
			row = max(t.Shape.NumElements()/t.Shape[0], 1)
		}
		return fmt.Errorf("%w: %s: output %s (%s %s): element %d (chunk row %d) is %g",
			ErrNonFinite, stage, outputRole(g, t), t.Name, t.Shape, j, int64(j)/row, xs[j])
	}
	return nil
}

// ErrRefusedAfterAnalyze: under WithAnalyzeFirst, the device's analysis accepted every node of a
// stage and its prepare then refused the stage (core.ErrUnsupported): a capability lie, which
// the conformance suite fails, rather than a stage the device does not support.
var ErrRefusedAfterAnalyze = errors.New("llm: prepare refused a stage that analysis accepted")

// WithAnalyzeFirst makes the runner analyze every stage graph before preparing it. A node the
// device refuses then fails NewRunner with core.ErrUnsupported naming it, and a prepare refusal
// after the device accepted every node wraps ErrRefusedAfterAnalyze as well. Without it prepare
// alone decides, which cannot tell the two apart; the conformance model cases use it.
func WithAnalyzeFirst() RunnerOption { return func(c *runnerConfig) { c.analyzeFirst = true } }

// TeacherForced feeds ids after what the cache holds and returns the logits after every one of
// them, flattened ([len(ids)·vocab]): what a logits NMSE compares. A runner whose chunk length
// is len(ids) runs them in one pass.
func (r *Runner) TeacherForced(ctx context.Context, ids []int32) ([]float32, error) {
	out := make([]float32, 0, len(ids)*r.m.Config.Vocab)
	_, err := r.PrefillEach(ctx, ids, func(_ int, logits []float32) error {
		out = append(out, logits...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// NMSE is Σ(got−want)² / Σwant² (0 when both are all zero, +Inf when only want is).
func NMSE(got, want []float32) float64 {
	var num, den float64
	for i := range want {
		d := float64(got[i]) - float64(want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	if den == 0 {
		if num == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return num / den
}
