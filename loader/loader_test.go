package loader

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/modroot"
	"github.com/xpuhub/xpu/loader/plugintest"
)

// TestBrokenPlugins builds one plugin per way a plugin can be broken and checks that discovery
// keeps it as a rejected candidate with a clear reason, and that opening it fails with that
// reason and the right sentinel error, without a panic.
func TestBrokenPlugins(t *testing.T) {
	plugintest.CC(t)
	dir := t.TempDir()
	tests := []struct {
		name    string
		make    func(t *testing.T) string // returns the file
		err     error
		reason  string
		probeOK bool // the probe itself succeeds (the failure comes at open)
	}{
		{name: "file missing", make: func(t *testing.T) string { return filepath.Join(dir, "libxpu-gone.so") },
			err: core.ErrNotFound, reason: "file missing"},
		{name: "not a shared library", make: func(t *testing.T) string {
			p := filepath.Join(dir, "libxpu-text.so")
			require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\necho not a plugin\n"), 0o755))
			return p
		}, err: core.ErrIncompatible, reason: "not a shared library"},
		{name: "wrong architecture", make: func(t *testing.T) string {
			cc, err := exec.LookPath("aarch64-linux-gnu-gcc")
			if err != nil {
				t.Skip("aarch64-linux-gnu-gcc not found")
			}
			if out, err := exec.Command("uname", "-m").Output(); err == nil && string(out) == "aarch64\n" {
				t.Skip("this machine is aarch64: build for it is not a foreign architecture")
			}
			return plugintest.Build(t, dir, "arm64", cc, `TP_NAME="arm64"`)
		}, err: core.ErrIncompatible, reason: "wrong architecture"},
		{name: "missing export", make: func(t *testing.T) string {
			return plugintest.Build(t, dir, "noopen", "", "TP_NO_OPEN", `TP_NAME="noopen"`)
		}, err: core.ErrIncompatible, reason: "missing export xpu_plugin_open"},
		{name: "ABI major mismatch", make: func(t *testing.T) string {
			return plugintest.Build(t, dir, "abi2", "", "TP_ABI_MAJOR=2", `TP_NAME="abi2"`)
		}, err: core.ErrIncompatible, reason: "ABI major 2"},
		{name: "probe score 0", make: func(t *testing.T) string {
			return plugintest.Build(t, dir, "zero", "", "TP_SCORE_ZERO", `TP_NAME="zero"`)
		}, err: core.ErrUnsupported, reason: "libvendor-test.so.1 not found", probeOK: true},
		{name: "open fails", make: func(t *testing.T) string {
			return plugintest.Build(t, dir, "openfails", "", "TP_OPEN_FAILS", `TP_NAME="openfails"`)
		}, err: core.ErrMissingDependency, reason: "libfake.so.2 could not be initialised", probeOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.make(t)
			cands, err := Discover(context.Background(), WithPaths(path), WithoutEnv(), WithoutDefaultDirs())
			require.NoError(t, err)
			require.Len(t, cands, 1)
			cd := cands[0]
			assert.False(t, cd.Chosen && !tt.probeOK, "a broken plugin is never chosen")
			if !tt.probeOK {
				require.Error(t, cd.Err)
				assert.ErrorIs(t, cd.Err, tt.err)
				assert.Contains(t, cd.Reason, tt.reason)
			}
			if tt.name == "probe score 0" {
				assert.False(t, cd.Chosen)
				assert.Equal(t, 0, cd.Score)
				assert.Equal(t, "libvendor-test.so.1 not found", cd.Reason)
			}

			be, err := Open(context.Background(), path, WithoutEnv())
			require.Error(t, err)
			assert.Nil(t, be)
			assert.ErrorIs(t, err, tt.err)
			assert.Contains(t, err.Error(), tt.reason)
			assert.Contains(t, err.Error(), filepath.Base(path), "the error names the file")
		})
	}
}

func TestDiscoveryChoosesBestScore(t *testing.T) {
	plugintest.CC(t)
	low, high, envDir := t.TempDir(), t.TempDir(), t.TempDir()
	lowPath := plugintest.Build(t, low, "dup", "", `TP_NAME="dup"`, "TP_SCORE=5")
	highPath := plugintest.Build(t, high, "dup", "", `TP_NAME="dup"`, "TP_SCORE=50")
	envPath := plugintest.Build(t, envDir, "fromenv", "", `TP_NAME="fromenv"`)
	require.NoError(t, os.WriteFile(filepath.Join(envDir, "notes.txt"), []byte("ignored"), 0o644))
	t.Setenv(EnvPluginPath, envDir+string(os.PathListSeparator)+filepath.Join(envDir, "libxpu-nothere.so"))

	cands, err := Discover(context.Background(), WithPaths(low, high), WithoutDefaultDirs())
	require.NoError(t, err)
	byPath := map[string]Candidate{}
	for _, c := range cands {
		byPath[filepath.Base(filepath.Dir(c.Path))+"/"+filepath.Base(c.Path)] = c
	}
	require.Len(t, cands, 4)
	assert.True(t, cands[1].Chosen, "the score-50 copy wins")
	assert.Equal(t, highPath, cands[1].Path)
	assert.False(t, cands[0].Chosen)
	assert.Equal(t, lowPath, cands[0].Path)
	assert.Contains(t, cands[0].Reason, "is preferred")
	assert.Equal(t, envPath, cands[2].Path)
	assert.True(t, cands[2].Chosen)
	assert.Equal(t, EnvPluginPath, cands[2].Source)
	assert.ErrorIs(t, cands[3].Err, core.ErrNotFound, "a missing .so named in XPU_PLUGIN_PATH is reported")

	cands, err = Discover(context.Background(), WithPaths(low), WithoutEnv(), WithoutDefaultDirs())
	require.NoError(t, err)
	require.Len(t, cands, 1, "WithoutEnv ignores XPU_PLUGIN_PATH")

	be, err := Open(context.Background(), "dup", WithPaths(low, high), WithoutDefaultDirs())
	require.NoError(t, err)
	assert.Equal(t, 50, be.Info().Score)
	assert.Equal(t, highPath, be.Info().Path)
	require.NoError(t, be.Close())

	bs, cands, err := OpenAll(context.Background(), WithPaths(low, high), WithoutDefaultDirs())
	require.NoError(t, err)
	require.Len(t, bs, 2)
	names := []string{bs[0].Info().Name, bs[1].Info().Name}
	assert.ElementsMatch(t, []string{"dup", "fromenv"}, names)
	assert.Len(t, cands, 4)
	for _, b := range bs {
		require.NoError(t, b.Close())
	}

	_, err = Open(context.Background(), "nosuchbackend", WithoutEnv(), WithoutDefaultDirs())
	assert.ErrorIs(t, err, core.ErrNotFound)
	_, err = Open(context.Background(), "zero", WithPaths(t.TempDir()), WithoutEnv(), WithoutDefaultDirs())
	assert.ErrorIs(t, err, core.ErrNotFound)
}

func TestOpenByNameExplainsRejection(t *testing.T) {
	dir := t.TempDir()
	plugintest.Build(t, dir, "zero", "", "TP_SCORE_ZERO", `TP_NAME="gpu0"`)
	_, err := Open(context.Background(), "gpu0", WithPaths(dir), WithoutEnv(), WithoutDefaultDirs())
	require.ErrorIs(t, err, core.ErrNotFound)
	assert.Contains(t, err.Error(), "libvendor-test.so.1 not found")
}

func TestOpenRef(t *testing.T) {
	be, err := Open(context.Background(), RefName)
	require.NoError(t, err)
	assert.Equal(t, "ref", be.Info().Name)
	assert.NotEmpty(t, be.Devices())
	require.NoError(t, be.Close())

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Open(ctx, RefName)
	assert.ErrorIs(t, err, context.Canceled)
	_, err = Discover(ctx)
	assert.ErrorIs(t, err, context.Canceled)
}

func TestDefaultDirs(t *testing.T) {
	c := newConfig([]Option{WithoutEnv()})
	var sources []string
	for _, s := range c.searchList() {
		sources = append(sources, s.source)
	}
	assert.Equal(t, []string{"executable", "build", "build"}, sources)
	root := modroot.Find()
	require.NotEmpty(t, root, "tests run inside the module")
	assert.Equal(t, filepath.Join(root, "build", "plugins"), c.searchList()[2].path)
}
