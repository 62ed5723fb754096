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

// TestSourceRegistersDiscovery: importing the loader makes discovery the registry's plugin
// source, and a Source opens through the registry what Discover chooses (the best-scoring copy
// of a name), lists the usable plugins' devices lazily, leaves out a plugin scoring 0, and never
// lets a plugin shadow a built-in backend's name.
func TestSourceRegistersDiscovery(t *testing.T) {
	plugintest.CC(t)
	require.NotNil(t, core.DefaultSource(), "the loader's init registers its discovery")
	_, isLoader := core.DefaultSource().(*Source)
	assert.True(t, isLoader)

	low, high, zdir, rdir := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	plugintest.Build(t, low, "srcok", "", `TP_NAME="srcok"`, "TP_SCORE=5")
	highPath := plugintest.Build(t, high, "srcok", "", `TP_NAME="srcok"`, "TP_SCORE=50")
	plugintest.Build(t, zdir, "srczero", "", "TP_SCORE_ZERO", `TP_NAME="srczero"`)
	plugintest.Build(t, rdir, "ref", "", `TP_NAME="ref"`)
	src := NewSource(WithPaths(low, high, zdir, rdir), WithoutEnv(), WithoutDefaultDirs())
	ctx := context.Background()

	tests := []struct {
		name     string
		open     string
		wantPath string // "" for the built-in backend
		wantErr  error
		wantIn   string // in the error: the reason a rejected plugin gives
	}{
		{name: "the best copy of a name", open: "srcok", wantPath: highPath},
		{name: "a plugin scoring 0 does not open", open: "srczero", wantErr: core.ErrNotFound,
			wantIn: "libvendor-test.so.1 not found"},
		{name: "an unknown name", open: "srcmissing", wantErr: core.ErrNotFound},
		{name: "a built-in name stays built in", open: ref.Name, wantPath: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			be, err := core.OpenBackend(ctx, src, tc.open)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				assert.Contains(t, err.Error(), tc.wantIn)
				return
			}
			require.NoError(t, err)
			defer be.Close()
			assert.Equal(t, tc.wantPath, be.Info().Path)
		})
	}

	lazy, err := src.Lazy(ctx)
	require.NoError(t, err)
	var backends []string
	for _, d := range lazy.Devices() {
		backends = append(backends, d.Info().Backend)
	}
	assert.Contains(t, backends, "srcok")
	assert.NotContains(t, backends, "srczero", "a plugin scoring 0 lists no device")
	for _, b := range lazy.Backends() {
		require.NoError(t, b.Close())
	}

	_, err = src.Lazy(canceledCtx())
	require.ErrorIs(t, err, context.Canceled)
}

func canceledCtx() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
