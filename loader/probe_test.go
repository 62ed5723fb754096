package loader

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/loader/plugintest"
)

// brokenZoo builds, in a fresh folder, one plugin per way of breaking discovery (a probe that
// segfaults, aborts, hangs or exits, a plugin with no device, a FIFO named like a plugin) and
// one good plugin. It returns the folder.
func brokenZoo(t *testing.T) string {
	t.Helper()
	plugintest.CC(t)
	dir := t.TempDir()
	for _, p := range []struct{ name, def string }{
		{"segv", "TP_PROBE_FAULT=1"}, {"abort", "TP_PROBE_FAULT=2"}, {"hang", "TP_PROBE_FAULT=3"},
		{"exit", "TP_PROBE_FAULT=4"}, {"nodev", "TP_ZERO_DEVICES"}, {"good", "TP_SCORE=10"},
	} {
		plugintest.Build(t, dir, p.name, "", p.def, `TP_NAME="`+p.name+`"`)
	}
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "libxpu-fifo.so"), 0o644))
	return dir
}

func byBase(cands []Candidate) map[string]Candidate {
	m := map[string]Candidate{}
	for _, c := range cands {
		m[strings.TrimSuffix(strings.TrimPrefix(filepath.Base(c.Path), "libxpu-"), ".so")] = c
	}
	return m
}

// TestDiscoverSurvivesBrokenProbes: before probes ran in a child, the first of these plugins
// killed the test process (and the FIFO or the hang blocked it forever).
func TestDiscoverSurvivesBrokenProbes(t *testing.T) {
	dir := brokenZoo(t)
	cache := t.TempDir()
	// generous for a -race test binary's start on a loaded machine; the hang costs this much
	opts := []Option{WithPaths(dir), WithoutEnv(), WithoutDefaultDirs(), WithProbeCacheDir(cache),
		WithProbeTimeout(4 * time.Second)}
	before := probeChildren.Load()
	cands, err := Discover(context.Background(), opts...)
	require.NoError(t, err)
	got := byBase(cands)
	require.Len(t, got, 7)
	for _, tc := range []struct {
		name   string
		err    error
		reason string
	}{
		{"segv", core.ErrBackendCrashed, "probe crashed (SIGSEGV"},
		{"abort", core.ErrBackendCrashed, "probe crashed (SIGABRT"},
		{"hang", core.ErrTimeout, "probe hung: no answer within 4s"},
		{"exit", core.ErrBackendCrashed, "called exit(0) during xpu_plugin_probe"},
		{"fifo", core.ErrInvalidArgument, "named pipe (FIFO), not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := got[tc.name]
			require.Error(t, c.Err)
			assert.ErrorIs(t, c.Err, tc.err)
			if tc.name != "fifo" {
				assert.ErrorIs(t, c.Err, ErrProbeFault)
			}
			assert.Contains(t, c.Reason, tc.reason)
			assert.False(t, c.Chosen)
		})
	}
	assert.True(t, got["good"].Chosen, got["good"].Reason)
	assert.True(t, got["nodev"].Chosen, "a 0-device plugin probes fine; open says why it is useless: %s",
		got["nodev"].Reason)
	// one child per regular file, none for the FIFO
	assert.Equal(t, int64(6), probeChildren.Load()-before)

	// warm cache: no child but for the hang (a timeout is not cached), same verdicts
	before = probeChildren.Load()
	again, err := Discover(context.Background(), opts...)
	require.NoError(t, err)
	assert.Equal(t, int64(1), probeChildren.Load()-before, "a warm discovery started a child for a cached answer")
	for name, c := range byBase(again) {
		assert.Equal(t, got[name].Reason, c.Reason, name)
		assert.Equal(t, got[name].Chosen, c.Chosen, name)
	}

	// a changed file is probed afresh; Rescan probes everything
	good := filepath.Join(dir, "libxpu-good.so")
	plugintest.Build(t, dir, "good", "", "TP_SCORE=11", `TP_NAME="good"`)
	before = probeChildren.Load()
	again, err = Discover(context.Background(), opts...)
	require.NoError(t, err)
	assert.Equal(t, int64(2), probeChildren.Load()-before, "the changed file and the hang")
	assert.Equal(t, 11, byBase(again)["good"].Score, good)
	before = probeChildren.Load()
	_, err = Discover(context.Background(), WithPaths(good), WithoutEnv(), WithoutDefaultDirs(),
		WithProbeCacheDir(cache), Rescan())
	require.NoError(t, err)
	assert.Equal(t, int64(1), probeChildren.Load()-before, "Rescan ignores the cached answer")
}

// A probe that timed out once (a loaded machine) is probed again on the next start and then
// chosen: only crashes are cached, a timeout used to disable the plugin until --rescan.
func TestProbeTimeoutIsNotCached(t *testing.T) {
	plugintest.CC(t)
	dir := t.TempDir()
	plugintest.Build(t, dir, "slow", "", "TP_PROBE_FAULT=5", `TP_NAME="slow"`)
	opts := []Option{WithPaths(dir), WithoutEnv(), WithoutDefaultDirs(), WithProbeCacheDir(t.TempDir()),
		WithProbeTimeout(2 * time.Second)}

	t.Setenv("TP_PROBE_SLOW", "1")
	cands, err := Discover(context.Background(), opts...)
	require.NoError(t, err)
	slow := byBase(cands)["slow"]
	require.Error(t, slow.Err)
	assert.ErrorIs(t, slow.Err, core.ErrTimeout)
	assert.False(t, slow.Chosen)

	require.NoError(t, os.Unsetenv("TP_PROBE_SLOW"))
	before := probeChildren.Load()
	cands, err = Discover(context.Background(), opts...)
	require.NoError(t, err)
	assert.Equal(t, int64(1), probeChildren.Load()-before, "the timeout was answered from the cache")
	slow = byBase(cands)["slow"]
	assert.NoError(t, slow.Err)
	assert.True(t, slow.Chosen, slow.Reason)
}

// TestOpenZeroDevices: a plugin that opens with no device used to vanish from every listing.
func TestOpenZeroDevices(t *testing.T) {
	plugintest.CC(t)
	path := plugintest.Plugin(t, "TP_ZERO_DEVICES")
	opts := []Option{WithoutEnv(), WithoutDefaultDirs(), WithProbeCacheDir(t.TempDir())}
	for _, iso := range []bool{false, true} {
		o := opts
		if iso {
			o = append(o, Isolated())
		}
		_, err := Open(context.Background(), path, o...)
		require.Error(t, err, "isolated %v", iso)
		assert.ErrorIs(t, err, core.ErrUnsupported)
		assert.Contains(t, err.Error(), "opened with 0 devices")
	}
	cands, err := Discover(context.Background(), append(opts, WithPaths(path))...)
	require.NoError(t, err)
	require.Len(t, cands, 1)
	_, err = Inspect(context.Background(), cands[0], opts...)
	assert.ErrorIs(t, err, core.ErrUnsupported)
	assert.Contains(t, err.Error(), "opened with 0 devices")

	good := plugintest.Plugin(t)
	cands, err = Discover(context.Background(), append(opts, WithPaths(good))...)
	require.NoError(t, err)
	devs, err := Inspect(context.Background(), cands[0], opts...)
	require.NoError(t, err)
	require.Len(t, devs, 1)
	assert.Equal(t, "testplugin", devs[0].Backend)
}

// TestDiscoverCancel: cancelling the context stops a discovery stuck in a hanging probe, and
// kills the probe child.
func TestDiscoverCancel(t *testing.T) {
	plugintest.CC(t)
	path := plugintest.Plugin(t, "TP_PROBE_FAULT=3")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	_, err := Discover(ctx, WithPaths(path), WithoutEnv(), WithoutDefaultDirs(),
		WithProbeCacheDir(t.TempDir()), WithProbeTimeout(time.Hour))
	require.ErrorIs(t, err, context.Canceled)
	assert.Zero(t, processesNaming(t, path), "the probe child outlived the cancel")
}

// processesNaming counts the live processes whose command line mentions s.
func processesNaming(t *testing.T, s string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Skip("no /proc")
	}
	n := 0
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), s) {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			// a zombie is already dead: only its parent's wait is missing
			if f := strings.Fields(string(st)); len(f) > 2 && f[2] == "Z" {
				continue
			}
		}
		n++
	}
	return n
}

// TestChildEnvDropsIsolation: a plugin host must not inherit what would make it isolate (and
// so start a host of its own) or pick another host binary.
func TestChildEnvDropsIsolation(t *testing.T) {
	t.Setenv(EnvIsolate, "all")
	t.Setenv(EnvHostBinary, "/bin/false")
	t.Setenv("XPU_LOG", "debug")
	env := strings.Join(childEnv("A=1"), "\n")
	assert.NotContains(t, env, EnvIsolate+"=")
	assert.NotContains(t, env, EnvHostBinary+"=")
	assert.Contains(t, env, "XPU_LOG=debug")
	assert.Contains(t, env, "A=1")
}

// TestPluginHostStartsNoHost: a process started as a plugin host refuses to start another.
func TestPluginHostStartsNoHost(t *testing.T) {
	t.Setenv(handshake.MagicCookieKey, handshake.MagicCookieValue)
	_, err := hostCommand("/bin/true", nil)
	require.ErrorIs(t, err, ErrInPluginHost)
	_, err = Open(context.Background(), plugintest.Plugin(t), WithoutEnv(), Isolated(),
		WithProbeCacheDir(t.TempDir()))
	require.ErrorIs(t, err, ErrInPluginHost)
}

// BenchmarkDiscoverWarmCache is discovery at a normal start-up: every answer from the cache
// (stat, hash and one small file read per plugin; no child).
func BenchmarkDiscoverWarmCache(b *testing.B) {
	cache := b.TempDir()
	ctx := context.Background()
	cands, err := Discover(ctx, WithProbeCacheDir(cache), WithoutEnv())
	require.NoError(b, err)
	if len(cands) == 0 {
		b.Skip("no plugin built (make all)")
	}
	before := probeChildren.Load()
	b.ResetTimer()
	for b.Loop() {
		if _, err := Discover(ctx, WithProbeCacheDir(cache), WithoutEnv()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	require.Equal(b, before, probeChildren.Load(), "a warm discovery started a child")
	b.ReportMetric(float64(len(cands)), "plugins")
}
