package sched_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched"
)

// TestSessionOnPlugins runs the transformer block on each built plugin through sessions: the
// whole graph on the plugin's device, and split with only the matmuls on it (the rest on the
// reference, so tensors cross between a C plugin's buffers and Go's), through Run and through
// an Execution bound to the plugin's buffers. Plugins that are not built or cannot run here
// are skipped.
func TestSessionOnPlugins(t *testing.T) {
	ctx := context.Background()
	refB := ref.New()
	defer refB.Close()
	refDev := refB.Devices()[0]
	g := block(t)
	whole, err := sched.NewSession(ctx, g, []core.Device{refDev}, quiet)
	require.NoError(t, err)
	defer whole.Close()
	in := blockInputs(5)
	want, err := whole.Run(ctx, in)
	require.NoError(t, err)

	for _, name := range []string{"neon", "opencl"} {
		t.Run(name, func(t *testing.T) {
			b, err := loader.Open(ctx, name)
			if errors.Is(err, core.ErrNotFound) {
				required.Skip(t, name, "plugin %s not built or cannot run here (run make): %v", name, err)
			}
			require.NoError(t, err)
			defer b.Close()
			dev := b.Devices()[0]
			mm := &pickyDevice{Device: dev, backend: name + "-matmul", kind: core.DeviceNPU,
				accepts: map[core.Op]bool{core.OpMatMul: true}}
			for _, ds := range [][]core.Device{{dev}, {mm, refDev}} {
				s, err := sched.NewSession(ctx, g, ds, sched.WithPolicy(sched.PreferNPU), quiet)
				require.NoError(t, err)
				r := s.Report()
				assert.Equal(t, ds[0].Info().ID(), r.Units[0])
				got, err := s.Run(ctx, in)
				require.NoError(t, err)
				// the plugin may compute matmuls at f16 (opencl): a loose bound
				assert.InDeltaSlice(t, core.DecodeF32(want[0]), core.DecodeF32(got[0]), 2e-2)

				x, err := s.NewExecution()
				require.NoError(t, err)
				var bufs []core.Buffer
				for i, data := range append(in, make([]byte, len(want[0]))) {
					buf, err := s.Alloc(ctx, ds[0], int64(len(data)), core.BufferDevice)
					require.NoError(t, err)
					require.NoError(t, buf.Write(0, data))
					require.NoError(t, x.Bind(i, buf, 0))
					bufs = append(bufs, buf)
				}
				require.NoError(t, x.Run(ctx))
				out := make([]byte, len(want[0]))
				require.NoError(t, bufs[2].Read(0, out))
				assert.Equal(t, got[0], out, "Execution and Run agree")
				require.NoError(t, x.Close())
				for _, buf := range bufs {
					require.NoError(t, buf.Close())
				}
				require.NoError(t, s.Close())
			}
		})
	}
}
