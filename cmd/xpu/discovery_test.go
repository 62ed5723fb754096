package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/internal/modroot"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/loader/plugintest"
)

// envAsCLI makes this test binary, re-executed, be the xpu command (so that a test can give a
// command a deadline and see its exit status, even when a plugin ends the process).
const envAsCLI = "XPU_TEST_AS_CLI"

func TestMain(m *testing.M) {
	// the loader starts this binary as plugin host (isolated runs, xpu devices' inspection)
	loader.ServeIfPluginHost()
	// as the CLI: for cliChild, and where xpu starts itself (a supervised or isolated conform)
	if os.Getenv(envAsCLI) == "1" || os.Getenv(envCLIChild) == "1" {
		if len(os.Args) > 1 {
			startCrashMonitor(os.Args[1])
		}
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	code := m.Run()
	plugintest.Cleanup()
	os.Exit(code)
}

// cliChild runs this binary as `xpu args...` with extra environment, killed at the deadline.
func cliChild(t *testing.T, deadline time.Duration, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(append(os.Environ(), envAsCLI+"=1"), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	require.NoError(t, ctx.Err(), "xpu %v ran past %v:\n%s%s", args, deadline, out.String(), errb.String())
	if err != nil {
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// brokenPluginDir holds a plugin whose probe segfaults, one whose probe hangs, and a FIFO
// named like a plugin: each used to crash or hang every xpu command.
func brokenPluginDir(t *testing.T) string {
	t.Helper()
	plugintest.CC(t)
	dir := t.TempDir()
	plugintest.Build(t, dir, "probesegv", "", "TP_PROBE_FAULT=1", `TP_NAME="probesegv"`)
	plugintest.Build(t, dir, "probehang", "", "TP_PROBE_FAULT=3", `TP_NAME="probehang"`)
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "libxpu-fifo.so"), 0o644))
	return dir
}

func builtPlugin(t *testing.T, name string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(modroot.Find(), "build", "plugins", name)); err != nil {
		t.Skipf("%s not built (make all): %v", name, err)
	}
}

// TestDevicesListsBrokenPlugins: `xpu devices -v` with the broken plugins on the path returns
// in time, exit 0, naming each with its reason, and still lists the good backends.
func TestDevicesListsBrokenPlugins(t *testing.T) {
	builtPlugin(t, "libxpu-neon.so")
	dir := brokenPluginDir(t)
	env := []string{loader.EnvPluginPath + "=" + dir, loader.EnvCacheDir + "=" + t.TempDir(),
		loader.EnvProbeTimeout + "=3s"}
	code, out, errOut := cliChild(t, 10*time.Second, env, "devices", "-v")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	rows := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		for _, name := range []string{"libxpu-probesegv.so", "libxpu-probehang.so", "libxpu-fifo.so"} {
			if strings.HasSuffix(line, name) {
				rows[name] = line
			}
		}
	}
	assert.Contains(t, rows["libxpu-probesegv.so"], "rejected: ")
	assert.Contains(t, rows["libxpu-probesegv.so"], "probe crashed (SIGSEGV")
	assert.Contains(t, rows["libxpu-probehang.so"], "probe hung: no answer within 3s")
	assert.Contains(t, rows["libxpu-fifo.so"], "named pipe (FIFO), not a regular file")
	assert.Regexp(t, `(?m)^neon +0: `, out, "the good plugins are still listed")
}

// TestRunIsolatedBesideBrokenPlugins: generation works with the broken plugins on the path.
func TestRunIsolatedBesideBrokenPlugins(t *testing.T) {
	builtPlugin(t, "libxpu-neon.so")
	model := storiesPath(t)
	want, err := os.ReadFile(filepath.Join(filepath.Dir(model), "stories260K.greedy.txt"))
	require.NoError(t, err)
	abs, err := filepath.Abs(model)
	require.NoError(t, err)
	dir := brokenPluginDir(t)
	env := []string{loader.EnvPluginPath + "=" + dir, loader.EnvCacheDir + "=" + t.TempDir(),
		loader.EnvProbeTimeout + "=3s"}
	code, out, errOut := cliChild(t, 2*time.Minute, env, "run", "--isolated", "--model", abs,
		"--temp", "0", "-n", "32", "--backend", "neon")
	require.Equal(t, 0, code, errOut)
	assert.Greater(t, len(out), 80)
	assert.True(t, strings.HasPrefix(string(want), strings.TrimSuffix(out, "\n")), out)
}

// TestConformPluginExit: a plugin that calls exit(0) in a call used to end `xpu conform` with
// status 0, no summary, and an earlier run's reports in place.
func TestConformPluginExit(t *testing.T) {
	plugintest.CC(t)
	path := plugintest.Plugin(t, "TP_FAULT=5")
	reports := t.TempDir()
	for _, ext := range []string{".json", ".md", ".xml", ".html"} {
		require.NoError(t, os.WriteFile(filepath.Join(reports, "testplugin"+ext), []byte("stale"), 0o644))
	}
	env := []string{loader.EnvCacheDir + "=" + t.TempDir()}
	code, out, errOut := cliChild(t, 2*time.Minute, env, "conform", "--plugin", path, "--report", reports)
	assert.Equal(t, abi.ExitStatusPluginExit, code, "%s%s", out, errOut)
	assert.Contains(t, errOut, "plugin testplugin called exit(0) during ")
	left, err := os.ReadDir(reports)
	require.NoError(t, err)
	assert.Empty(t, left, "an earlier run's reports would pass for this run's")
}

// TestConformOpenFailureRemovesOldReports: a backend that cannot be opened any more (here: it
// opens with 0 devices) fails the run, and its earlier reports do not stay in place.
func TestConformOpenFailureRemovesOldReports(t *testing.T) {
	plugintest.CC(t)
	dir := t.TempDir()
	plugintest.Build(t, dir, "nodev", "", "TP_ZERO_DEVICES", `TP_NAME="nodev"`)
	t.Setenv(loader.EnvPluginPath, dir)
	t.Setenv(loader.EnvCacheDir, t.TempDir())
	reports := t.TempDir()
	for _, ext := range []string{".json", ".md", ".xml", ".html"} {
		require.NoError(t, os.WriteFile(filepath.Join(reports, "nodev"+ext), []byte("stale"), 0o644))
	}
	code, out, errOut := runCLI(t, "conform", "--plugin", "nodev", "--report", reports)
	assert.Equal(t, 1, code, errOut)
	assert.Contains(t, out, "opened with 0 devices")
	assert.Contains(t, out, "0 passed, 1 failed")
	left, err := os.ReadDir(reports)
	require.NoError(t, err)
	assert.Empty(t, left)
}
