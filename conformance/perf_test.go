package conformance

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/kernelbench"
	"github.com/xpuhub/xpu/loader"
)

// Performance mode times what the device supports, declines the rest with the reason, and
// sets the figures against the declared peaks, or for a CPU that declares no bandwidth (an
// ABI 1.0 plugin) against the measured read bandwidth.
func TestRunPerf(t *testing.T) {
	plugins := buildMutants(t, "", "TP_DEVICE_INFO_1_0")
	filter := regexp.MustCompile(`^(MATMUL 1x4096x4096 (f32|q4_0)|ADD f32)`)
	tests := []struct {
		variant  string
		source   string
		peakGBps float64
		peakFLOP float64
	}{
		{"", "declared", 12, 34},
		{"TP_DEVICE_INFO_1_0", "measured read bandwidth, 2 threads", 5, 0},
	}
	for _, tt := range tests {
		t.Run("peaks "+tt.source, func(t *testing.T) {
			ctx := context.Background()
			b, err := loader.Open(ctx, plugins[tt.variant], loader.WithoutEnv())
			require.NoError(t, err)
			defer b.Close()
			measured := false
			rep, err := RunPerf(ctx, b, PerfOptions{MinTime: 10 * time.Millisecond, Filter: filter,
				ReadBandwidth: func(context.Context, int) (float64, error) { measured = true; return 5e9, nil }})
			require.NoError(t, err)
			assert.Equal(t, tt.source, rep.PeakGBpsSource)
			assert.Equal(t, tt.peakGBps, rep.PeakGBps)
			assert.Equal(t, tt.variant != "", measured, "the bandwidth is measured only when none is declared")
			require.Len(t, rep.Results, 3)
			byName := map[string]PerfResult{}
			for _, r := range rep.Results {
				byName[r.Name] = r
			}
			mm := byName["MATMUL 1x4096x4096 f32"]
			require.Equal(t, StatusPass, mm.Status, mm.Reason)
			assert.GreaterOrEqual(t, mm.Runs, 3)
			assert.Positive(t, mm.GBps)
			assert.InDelta(t, mm.Bytes/(mm.USPerRun*1e3), mm.GBps, mm.GBps*1e-6, "GB/s is the bytes over the time per run")
			assert.InDelta(t, 2*4096*4096/(mm.USPerRun*1e3), mm.GFLOPs, mm.GFLOPs*1e-6)
			assert.Equal(t, float64(4*(4096*4096+2*4096)), mm.Bytes, "weights, input and output")
			assert.Equal(t, tt.peakFLOP, mm.PeakGFLOP)
			assert.Equal(t, StatusPass, byName["ADD f32 [1024,4096]"].Status)
			q := byName["MATMUL 1x4096x4096 q4_0"]
			assert.Equal(t, StatusUnsupported, q.Status)
			assert.NotEmpty(t, q.Reason)

			var out strings.Builder
			require.NoError(t, rep.WriteTable(&out))
			assert.Contains(t, out.String(), "% PEAK BW")
			assert.Regexp(t, `MATMUL 1x4096x4096 f32 +f32 +[0-9.]+ +[0-9.]+ +[0-9]+%`, out.String())
			assert.Regexp(t, `MATMUL 1x4096x4096 q4_0 +unsupported`, out.String())
		})
	}
}

// The decode GEMV cases are `xpu bench --kernels`' GEMVs: the same shapes and weights, and
// bytes that differ from its weight bytes by the activation and output only (under 1 %), so
// for the same time per run both print the same GB/s within that.
func TestPerfGEMVsAreBenchKernels(t *testing.T) {
	byName := map[string]perfCase{}
	for _, pc := range perfCases() {
		byName[pc.name] = pc
	}
	for i, s := range kernelbench.GEMVShapes {
		for _, dt := range kernelbench.GEMVTypes {
			pc, ok := byName[fmt.Sprintf("MATMUL %s %s", s, dt)]
			require.True(t, ok, "no perf case for GEMV %s %s", s, dt)
			assert.Equal(t, s.FLOP(), pc.flop)
			if i > 0 || !dt.Quantized() {
				continue // generating the larger weights takes the race detector long
			}
			g, _, err := pc.build(caseRand(pc.name, 0))
			require.NoError(t, err)
			w, err := kernelbench.Weights(dt, s.N, s.K)
			require.NoError(t, err)
			var konst []byte
			for _, tn := range g.Tensors {
				if tn.Kind == core.KindConst {
					konst = tn.Data
				}
			}
			assert.Equal(t, w, konst, "the same weights")
			weightBytes := float64(dt.Bytes(s.N * s.K))
			assert.InDelta(t, 1, graphBytes(g)/weightBytes, 0.01, "%s %s", s, dt)
		}
	}
}
