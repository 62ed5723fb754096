package loader

import (
	"context"
	"os"
	"testing"
	"time"

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

// TestWarmStartReadsNoPluginFile: a start whose plugins are unchanged since they were cached
// reads none of them through (hashing every plugin cost a start milliseconds); a file whose
// stat changed but not its bytes or modification time is hashed once and still answered from
// the cache; new bytes are probed.
func TestWarmStartReadsNoPluginFile(t *testing.T) {
	plugintest.CC(t)
	dir := t.TempDir()
	path := plugintest.Build(t, dir, "gamma", "", `TP_NAME="gamma"`)
	opts := []Option{WithoutEnv(), WithoutDefaultDirs(), WithPaths(dir), WithProbeCacheDir(t.TempDir())}
	ctx := context.Background()
	start := func() (children, hashes int64) {
		c0, h0 := probeChildren.Load(), fileHashes.Load()
		l, err := OpenLazy(ctx, opts...)
		require.NoError(t, err)
		require.Len(t, l.Devices(), 1)
		require.NoError(t, l.Close())
		return probeChildren.Load() - c0, fileHashes.Load() - h0
	}
	c, _ := start()
	assert.Equal(t, int64(1), c, "the first start probes")

	tests := []struct {
		name             string
		change           func(t *testing.T)
		children, hashes int64
	}{
		{name: "unchanged", change: func(*testing.T) {}, children: 0, hashes: 0},
		{name: "change time moved", change: func(t *testing.T) {
			// the same bytes and modification time, a new change time (a chmod, a backup
			// tool's restore of the times): not rewritten, the plugin is mapped in this process
			st, err := os.Stat(path)
			require.NoError(t, err)
			require.NoError(t, os.Chtimes(path, time.Now(), st.ModTime()))
		}, children: 0, hashes: 2}, // the probe answer and the device list, each re-keyed once
		{name: "unchanged after the re-key", change: func(*testing.T) {}, children: 0, hashes: 0},
		{name: "new bytes", change: func(t *testing.T) {
			plugintest.Build(t, dir, "gamma", "", `TP_NAME="gamma"`, "TP_SCORE=12")
		}, children: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.change(t)
			c, h := start()
			assert.Equal(t, tc.children, c, "probe children")
			if tc.children == 0 {
				assert.Equal(t, tc.hashes, h, "plugin files read through")
			}
		})
	}
}
