package sched_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/sched"
)

// BenchmarkSessionOverhead compares a session's Run (one partition, and the matmul-split
// transformer block) with the backend's own execution of the same graph, to show what the
// session layer costs per call.
func BenchmarkSessionOverhead(b *testing.B) {
	ctx := context.Background()
	refB := ref.New()
	defer refB.Close()
	refDev := refB.Devices()[0]
	npu := &pickyDevice{Device: refDev, backend: "npu-sim", kind: core.DeviceNPU,
		accepts: map[core.Op]bool{core.OpMatMul: true}}
	g := block(b)
	in := blockInputs(1)

	b.Run("backend-execution", func(b *testing.B) {
		c, err := refDev.NewContext(ctx, nil)
		require.NoError(b, err)
		defer c.Close()
		exe, err := c.Prepare(ctx, g)
		require.NoError(b, err)
		defer exe.Close()
		x, err := exe.NewExecution()
		require.NoError(b, err)
		defer x.Close()
		var bufs []core.Buffer
		for i, t := range append(append([]*core.Tensor{}, g.Inputs...), g.Outputs...) {
			buf, err := c.Alloc(t.Bytes(), core.BufferDevice)
			require.NoError(b, err)
			defer buf.Close()
			require.NoError(b, x.Bind(i, buf, 0))
			bufs = append(bufs, buf)
		}
		out := make([]byte, g.Outputs[0].Bytes())
		for b.Loop() {
			for i, data := range in {
				require.NoError(b, bufs[i].Write(0, data))
			}
			require.NoError(b, x.Run(ctx))
			require.NoError(b, bufs[2].Read(0, out))
		}
	})
	for _, tc := range []struct {
		name string
		devs []core.Device
	}{{"session-1-partition", []core.Device{refDev}}, {"session-9-partitions", []core.Device{npu, refDev}}} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := sched.NewSession(ctx, g, tc.devs, quiet)
			require.NoError(b, err)
			defer s.Close()
			for b.Loop() {
				_, err := s.Run(ctx, in)
				require.NoError(b, err)
			}
		})
	}
}
