package main

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

// TestDemoVerdictFailsOnDisagreement plants faults in a result of the demo's block: before,
// the demo printed "ok" for any result that ran.
func TestDemoVerdictFailsOnDisagreement(t *testing.T) {
	ctx := context.Background()
	dev := ref.New().Devices()[0]
	for _, wt := range []core.DType{core.F32, core.F16, core.Q8_0, core.Q4_0} {
		cfg := blockConfig{Tokens: 3, Dim: 64, Heads: 8, KVHeads: 4, FFN: 160, WeightType: wt}
		g, err := buildBlock(cfg, 1)
		require.NoError(t, err)
		out, err := ref.Run(ctx, g, blockInputs(cfg, 1))
		require.NoError(t, err)
		want := core.DecodeF32(out[0])
		peak := peakAbs(want)
		faults := []struct {
			name  string
			plant func([]float32)
			ok    bool
		}{
			{"none", func([]float32) {}, true},
			{"rounding noise", func(x []float32) { x[3] *= 1 + 1e-7 }, true},
			{"one element off by the peak", func(x []float32) { x[5] += float32(peak) }, false},
			{"every element 10 % off", func(x []float32) {
				for i := range x {
					x[i] *= 1.1
				}
			}, false},
			{"a NaN", func(x []float32) { x[0] = float32(math.NaN()) }, false},
			{"an infinity", func(x []float32) { x[1] = float32(math.Inf(1)) }, false},
		}
		for _, f := range faults {
			t.Run(wt.String()+"/"+f.name, func(t *testing.T) {
				got := append([]float32(nil), want...)
				f.plant(got)
				maxAbs, nmse := compareF32(got, want)
				err := demoVerdict(ctx, dev, g, wt, nmse, maxAbs, peak)
				if f.ok {
					assert.NoError(t, err)
					return
				}
				require.Error(t, err)
				assert.Contains(t, err.Error(), "TOLERANCES.md row GRAPH:*")
			})
		}
	}
}
