package sched

import (
	"errors"
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// ErrNonFinite: a stage computed a NaN or an infinity (FiniteCheck). Corrupt weights or a
// backend's numerical bug give one, which otherwise flows on into every later stage.
var ErrNonFinite = errors.New("non-finite values")

// FirstNonFinite returns the index of the first NaN or infinity in xs, or -1. x-x is 0 for
// every finite x and NaN otherwise: one comparison per element, as callers run it on every
// token's logits.
func FirstNonFinite(xs []float32) int {
	for i, x := range xs {
		if x-x != 0 {
			return i
		}
	}
	return -1
}

// FiniteCheck is a debugging aid for a program: its Check, as the ProgramSpec's Check, reads
// back every F32 or F16 output of every partition after each run and fails with ErrNonFinite
// naming the stage, the output and the first element that is a NaN or an infinity, so the
// first stage computing one is found (at the cost of reading every activation to the host).
type FiniteCheck struct {
	// Graphs are the program's stage graphs by stage index: an output is named by its position
	// among its stage graph's outputs, and a tensor that only crosses partitions inside its
	// stage is "intermediate".
	Graphs []*core.Graph
	// Stage names stage s in errors (nil: "stage s").
	Stage func(s int) string
	// Output names output i of stage graph g (nil: its index).
	Output func(g *core.Graph, i int) string
}

// Check fails with ErrNonFinite when data (tensor t's bytes of stage stage, F32 or F16) holds a
// NaN or an infinity; it has ProgramSpec.Check's signature.
func (c FiniteCheck) Check(stage int, t *core.Tensor, data []byte) error {
	if t.DType != core.F32 && t.DType != core.F16 {
		return nil
	}
	name := fmt.Sprintf("stage %d", stage)
	if c.Stage != nil {
		name = c.Stage(stage)
	}
	xs, err := core.Dequantize(t.DType, data, 0)
	if err != nil {
		return fmt.Errorf("%s: output %s: %w", name, t.Name, err)
	}
	j := FirstNonFinite(xs)
	if j < 0 {
		return nil
	}
	row := int64(1)
	if len(t.Shape) > 0 {
		row = max(t.Shape.NumElements()/t.Shape[0], 1)
	}
	return fmt.Errorf("%w: %s: output %s (%s %s): element %d (chunk row %d) is %g",
		ErrNonFinite, name, c.role(stage, t), t.Name, t.Shape, j, int64(j)/row, xs[j])
}

// role names t by its position among stage's graph outputs (matched by name: t may be a
// partition's tensor standing for it).
func (c FiniteCheck) role(stage int, t *core.Tensor) string {
	if stage < 0 || stage >= len(c.Graphs) || c.Graphs[stage] == nil {
		return "intermediate"
	}
	g := c.Graphs[stage]
	for i, o := range g.Outputs {
		if o.Name != t.Name {
			continue
		}
		if c.Output != nil {
			return c.Output(g, i)
		}
		return fmt.Sprint(i)
	}
	return "intermediate"
}
