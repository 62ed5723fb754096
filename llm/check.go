package llm

import (
	"context"
	"errors"
	"fmt"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/sched"
)

// ErrNonFinite: the model computed a NaN or an infinity (corrupt weights or hyperparameters, or
// a backend's numerical bug). Without this check such logits sample as token 0 or a stop token
// and generation ends with empty text and no error. It is sched's: the stage checks
// (WithStageChecks) fail with it too.
var ErrNonFinite = sched.ErrNonFinite

// CheckLogits fails with ErrNonFinite when logits of position pos hold a NaN or an infinity:
// the check every Generate makes (the logits of one position are a few
// thousand floats, so it costs nothing next to the step that made them).
func CheckLogits(logits []float32, pos int) error {
	if i := sched.FirstNonFinite(logits); i >= 0 {
		return fmt.Errorf("llm: %w: logit %d of position %d is %g (XPU_LOG=debug or llm.WithStageChecks "+
			"names the first stage that computes one)", ErrNonFinite, i, pos, logits[i])
	}
	return nil
}

// WithStageChecks makes the runner read back every stage's outputs after each run and fail with
// ErrNonFinite naming the first stage (the embedding or a layer), output and element that is
// not finite: a debugging aid, as it reads every activation back to the host. Debug logging
// (the runner's logger enabled at slog.LevelDebug, as with XPU_LOG=debug in xpu) turns it on too.
func WithStageChecks() RunnerOption { return func(c *runnerConfig) { c.stageChecks = true } }

// finiteCheck is the stage checks' sched.FiniteCheck over the stage graphs of a program of the
// runner's, named as arch names the model's stages.
func (r *Runner) finiteCheck(stages []*core.Graph, name func(s int) string) sched.FiniteCheck {
	if name == nil {
		name = func(s int) string { return arch.StageName(s, r.m.Config.Layers) }
	}
	return sched.FiniteCheck{Graphs: stages, Stage: name, Output: arch.OutputRole}
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
