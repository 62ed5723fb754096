package llm

import (
	"context"
	"errors"
	"fmt"

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

// checkLogits is the check every Generate makes (the logits of one position are a few
// thousand floats, so it costs nothing next to the step that made them).
func checkLogits(logits []float32, pos int) error {
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

// checkedExecution checks the floating-point outputs of a stage after every Run. Submit is not
// checked (the runner runs stages synchronously).
type checkedExecution struct {
	core.Execution
	name string
	g    *core.Graph
	outs []boundOutput // by output index
}

type boundOutput struct {
	buf core.Buffer
	off int64
}

// outputRole names output i of a stage with n outputs (see outX..outV in graph.go).
func outputRole(i, n int) string {
	if n == 1 {
		return "logits"
	}
	if roles := [...]string{outX: "x", outQ: "q", outK: "k", outV: "v"}; i < len(roles) {
		return roles[i]
	}
	return fmt.Sprint(i)
}

func newCheckedExecution(e core.Execution, g *core.Graph, name string) *checkedExecution {
	return &checkedExecution{Execution: e, name: name, g: g, outs: make([]boundOutput, len(g.Outputs))}
}

func (c *checkedExecution) Bind(io int, buf core.Buffer, offset int64) error {
	if err := c.Execution.Bind(io, buf, offset); err != nil {
		return err
	}
	if o := io - len(c.g.Inputs); o >= 0 && o < len(c.outs) {
		c.outs[o] = boundOutput{buf, offset}
	}
	return nil
}

func (c *checkedExecution) Run(ctx context.Context) error {
	if err := c.Execution.Run(ctx); err != nil {
		return err
	}
	for i, t := range c.g.Outputs {
		b := c.outs[i]
		if b.buf == nil || (t.DType != core.F32 && t.DType != core.F16) {
			continue
		}
		raw := make([]byte, t.DType.Bytes(t.Shape.NumElements()))
		if err := b.buf.Read(b.off, raw); err != nil {
			return fmt.Errorf("llm: %s: read output %s back: %w", c.name, t.Name, err)
		}
		xs, err := core.Dequantize(t.DType, raw, 0)
		if err != nil {
			return fmt.Errorf("llm: %s: output %s: %w", c.name, t.Name, err)
		}
		if j := firstNonFinite(xs); j >= 0 {
			row := int64(1)
			if len(t.Shape) > 0 {
				row = max(t.Shape.NumElements()/t.Shape[0], 1)
			}
			return fmt.Errorf("%w: %s: output %s (%s %s): element %d (chunk row %d) is %g",
				ErrNonFinite, c.name, outputRole(i, len(c.g.Outputs)), t.Name, t.Shape, j, int64(j)/row, xs[j])
		}
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

// analyzeStage asks the device about every node of a stage: nil when it accepts them all.
func analyzeStage(ctx context.Context, c core.Context, g *core.Graph, name string) error {
	verdicts, err := c.Analyze(ctx, g)
	if err != nil {
		return fmt.Errorf("llm: %s: analyze: %w", name, err)
	}
	if len(verdicts) != len(g.Nodes) {
		return fmt.Errorf("llm: %s: analyze gave %d verdicts for %d nodes: %w", name, len(verdicts), len(g.Nodes), core.ErrInternal)
	}
	for i, v := range verdicts {
		if !v.Supported {
			return fmt.Errorf("llm: %s: node %s (%s) refused: %s: %w", name, g.Nodes[i].Name, g.Nodes[i].Op, v.Reason, core.ErrUnsupported)
		}
	}
	return nil
}
