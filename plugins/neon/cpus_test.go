package neon_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// TestCPUsNotOnline: a cpus= option naming a CPU that is not online, or no list at all, is
// refused at context creation and at prepare (pinning a worker to an absent CPU would fail
// silently and leave it wherever it was).
func TestCPUsNotOnline(t *testing.T) {
	f := pluginFiles(t)[0]
	b := openUsable(t, f)
	dev := b.Devices()[0]
	ctx := context.Background()
	for name, tc := range map[string]struct{ cpus, want string }{
		"absent":  {"1000", "CPU 1000, which is not online"},
		"garbage": {"0,,1", "bad cpus option"},
		"empty":   {"", "bad cpus option"},
	} {
		t.Run(filepath.Base(f)+"/"+name, func(t *testing.T) {
			_, err := dev.NewContext(ctx, map[string]string{"cpus": tc.cpus})
			require.ErrorIs(t, err, core.ErrInvalidArgument)
			require.ErrorContains(t, err, tc.want)

			c, err := dev.NewContext(ctx, nil)
			require.NoError(t, err)
			defer c.Close()
			g := core.NewGraph()
			g.Output(g.ReLU(g.Input("x", core.F32, 4)))
			require.NoError(t, g.Err())
			_, err = c.Prepare(ctx, g, core.WithPrepareOption("cpus", tc.cpus))
			require.ErrorIs(t, err, core.ErrInvalidArgument)
			require.ErrorContains(t, err, tc.want)
		})
	}
	c, err := dev.NewContext(ctx, map[string]string{"cpus": "0"})
	require.NoError(t, err, "cpu 0 is online")
	require.NoError(t, c.Close())
}
