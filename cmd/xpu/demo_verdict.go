package main

import (
	"context"
	"fmt"
	"math"

	"github.com/xpuhub/xpu/conformance"
	"github.com/xpuhub/xpu/core"
)

// demoBlockOp is the conformance suite's name for its transformer-block case, whose
// TOLERANCES.md rows judge the demo's block too.
const demoBlockOp = "GRAPH:transformer-block"

// demoVerdict judges a device's result (its NMSE and max-abs error against the reference, whose
// largest magnitude is peak) by the TOLERANCES.md row for a transformer block with weights of
// dtype wt at the lowest precision the device reports for g: nil when it agrees, else what is
// exceeded. NaN metrics (a NaN in the output) fail.
func demoVerdict(ctx context.Context, dev core.Device, g *core.Graph, wt core.DType, nmse, maxAbs, peak float64) error {
	tol, err := conformance.DefaultTolerances()
	if err != nil {
		return err
	}
	prec := core.PrecDefault
	if c, err := dev.NewContext(ctx, nil); err == nil {
		if v, err := c.Analyze(ctx, g); err == nil {
			prec = conformance.LowestPrecision(v)
		}
		_ = c.Close()
	}
	th, ok := tol.Lookup(demoBlockOp, wt.String(), prec.String())
	if !ok {
		return fmt.Errorf("TOLERANCES.md has no row for %s, %s, precision %s", demoBlockOp, wt, prec)
	}
	return th.Check(nmse, maxAbs, peak)
}

// peakAbs is the largest finite magnitude in xs.
func peakAbs(xs []float32) float64 {
	var p float64
	for _, x := range xs {
		if f := math.Abs(float64(x)); !math.IsInf(f, 0) && f > p {
			p = f
		}
	}
	return p
}
