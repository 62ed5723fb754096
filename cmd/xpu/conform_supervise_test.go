package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/loader/plugintest"
)

// A plugin that calls _exit(0) in the middle of the suite (no exit guard can catch it) used to
// end `xpu conform` with status 0 and no summary: a run that ends without its summary fails.
func TestConformWithoutSummaryFails(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a plugin: not in -short")
	}
	path := plugintest.Build(t, t.TempDir(), "quitter", "", "MUT_UNDERSCORE_EXIT")
	rc, out, errOut := runCLI(t, "conform", "--plugin", path, "--report", "",
		"--filter", `^(RELU\(dtype=f32,shape=\[17\]\)|SCALE\(dtype=f32,shape=\[7\]\))$`)
	assert.Equal(t, 1, rc, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Contains(t, out, "RELU(dtype=f32,shape=[17]): OK", "the case before the exit ran")
	assert.Contains(t, out, "FAIL: the conformance run exited with status 0 before its summary")
	assert.NotRegexp(t, summaryLine, lastLine(out))

	// the intact plugin's run still ends with its summary and status 0
	ok := plugintest.Build(t, t.TempDir(), "intact", "")
	rc, out, errOut = runCLI(t, "conform", "--plugin", ok, "--report", "", "--filter", `^SCALE\(dtype=f32,shape=\[7\]\)$`)
	assert.Equal(t, 0, rc, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Regexp(t, summaryLine, lastLine(out))
}

// A plugin hung inside a call used to make the in-process run unkillable by Ctrl-C: SIGINT
// now stops it within the grace period, says so, and the status is not 0.
func TestConformInterruptStopsAHungPlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a plugin: not in -short")
	}
	path := plugintest.Build(t, t.TempDir(), "hang", "", "MUT_HANG")
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "conform", "--plugin", path, "--report", "", "--filter", `^SCALE\(`)
	cmd.Env = append(os.Environ(), envAsCLI+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	// the supervising parent, then its child, then the suite's first SCALE case, which hangs
	time.Sleep(3 * time.Second)
	start := time.Now()
	require.NoError(t, cmd.Process.Signal(os.Interrupt)) // the parent alone, as `kill -INT` does
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(interruptGrace + 10*time.Second):
		t.Fatalf("xpu conform still running %v after SIGINT:\n%s%s", time.Since(start), out.String(), errb.String())
	}
	assert.Equal(t, exitInterrupted, cmd.ProcessState.ExitCode(), "stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	assert.Contains(t, out.String(), "interrupted: the run was killed after")
	assert.True(t, strings.HasPrefix(lastLine(out.String()), "interrupted:"), out.String())
}

// failedCases are the names of the FAIL lines of a conform run's output.
func failedCases(out string) []string {
	var names []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "  ") && strings.Contains(l, ": FAIL [") {
			names = append(names, strings.TrimSpace(l[:strings.Index(l, ": FAIL [")]))
		}
	}
	return names
}

// --isolated used to skip level 1 (the raw ABI): a plugin that failed cases in process passed
// isolated with 0 failed. Both modes now run the same levels and find the same failures,
// including a shutdown that leaks.
func TestConformIsolatedRunsTheSameLevels(t *testing.T) {
	if testing.Short() {
		t.Skip("builds plugins and runs the suite twice each: not in -short")
	}
	for _, def := range []string{"MUT_STALE_OK", "MUT_CTX_LEAK"} {
		t.Run(def, func(t *testing.T) {
			path := plugintest.Build(t, t.TempDir(), "mutant", "", def)
			rcIn, outIn, errIn := runCLI(t, "conform", "--plugin", path, "--report", "")
			rcIso, outIso, errIso := runCLI(t, "conform", "--isolated", "--plugin", path, "--report", "")
			require.Equal(t, 1, rcIn, "in process:\n%s%s", outIn, errIn)
			assert.Equal(t, 1, rcIso, "isolated:\n%s%s", outIso, errIso)
			assert.Equal(t, lastLine(outIn), lastLine(outIso), "the two modes' counts")
			assert.NotEmpty(t, failedCases(outIn))
			assert.Equal(t, failedCases(outIn), failedCases(outIso))
		})
	}
}
