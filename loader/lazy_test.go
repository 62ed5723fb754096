package loader

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/loader/plugintest"
)

func deviceIDs(devs []core.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.Info().ID())
	}
	return out
}

// TestLazyOpensOnlyTheDeviceUsed: the first start opens every plugin and caches its devices;
// later starts list the same devices without opening any plugin, and open only the plugin of
// the device asked for. Rescan and a rebuilt plugin go back to opening.
func TestLazyOpensOnlyTheDeviceUsed(t *testing.T) {
	plugintest.CC(t)
	dir := t.TempDir()
	plugintest.Build(t, dir, "alpha", "", `TP_NAME="alpha"`)
	plugintest.Build(t, dir, "beta", "", `TP_NAME="beta"`)
	cache := t.TempDir()
	opts := []Option{WithoutEnv(), WithoutDefaultDirs(), WithPaths(dir), WithProbeCacheDir(cache)}
	ctx := context.Background()
	want := []string{"alpha:0", "beta:0"}

	tests := []struct {
		name        string
		opts        []Option
		openedFirst int // plugins open right after OpenLazy
	}{
		{name: "cold cache opens every plugin", openedFirst: 2},
		{name: "warm cache opens none", openedFirst: 0},
		{name: "rescan opens every plugin", opts: []Option{Rescan()}, openedFirst: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := OpenLazy(ctx, append(append([]Option(nil), opts...), tc.opts...)...)
			require.NoError(t, err)
			defer func() { require.NoError(t, l.Close()) }()
			assert.Len(t, l.Backends(), tc.openedFirst)
			devs := l.Devices()
			require.ElementsMatch(t, want, deviceIDs(devs))
			var beta core.Device
			for _, d := range devs {
				if d.Info().Backend == "beta" {
					beta = d
				}
			}
			require.NotNil(t, beta)
			real, err := l.Open(ctx, beta)
			require.NoError(t, err)
			assert.Equal(t, "beta:0", real.Info().ID())
			again, err := l.Open(ctx, beta)
			require.NoError(t, err)
			assert.Same(t, real, again, "a plugin opens once")
			if tc.openedFirst == 0 {
				bs := l.Backends()
				require.Len(t, bs, 1, "only the plugin of the device used opens")
				assert.Equal(t, "beta", bs[0].Info().Name)
			}
			cctx, err := real.NewContext(ctx, nil)
			require.NoError(t, err, "the real device works")
			require.NoError(t, cctx.Close())
		})
	}

	t.Run("a device not of the set is its own", func(t *testing.T) {
		l, err := OpenLazy(ctx, opts...)
		require.NoError(t, err)
		rd := ref.New().Devices()[0]
		got, err := l.Open(ctx, rd)
		require.NoError(t, err)
		assert.Same(t, rd, got)
		require.NoError(t, l.Close())
		_, err = l.Open(ctx, l.Devices()[0])
		assert.ErrorIs(t, err, core.ErrBadState, "a closed set opens nothing")
	})

	t.Run("a rebuilt plugin is opened again", func(t *testing.T) {
		plugintest.Build(t, dir, "alpha", "", `TP_NAME="alpha"`, "TP_SCORE=11")
		l, err := OpenLazy(ctx, opts...)
		require.NoError(t, err)
		defer func() { require.NoError(t, l.Close()) }()
		bs := l.Backends()
		require.Len(t, bs, 1, "the new file's devices are not known yet")
		assert.Equal(t, "alpha", bs[0].Info().Name)
		assert.ElementsMatch(t, want, deviceIDs(l.Devices()))
	})
}
