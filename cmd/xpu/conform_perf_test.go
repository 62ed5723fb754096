package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/conformance"
	"github.com/xpuhub/xpu/loader/plugintest"
)

// `xpu conform --perf` prints the table beside the declared peaks and writes the perf report;
// a plugin that cannot be opened fails the run.
func TestConformPerf(t *testing.T) {
	plugin := plugintest.Plugin(t)
	dir := t.TempDir()
	var out, errb bytes.Buffer
	rc := run([]string{"conform", "--perf", "--plugin", plugin, "--filter", `^(ADD|MATMUL 1x4096x4096 q4_0)`,
		"--perf-time", "10ms", "--report", dir, "--harness", ""}, &out, &errb)
	require.Equal(t, 0, rc, "stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	assert.Contains(t, out.String(), "peaks: read 12.00 GB/s (declared); f32 34.0 GFLOP/s")
	assert.Regexp(t, `ADD f32 \[1024,4096\] +f32 +[0-9.]+ +[0-9.]+ +[0-9]+% +[0-9.]+ +[0-9]+%`, out.String())
	assert.Regexp(t, `MATMUL 1x4096x4096 q4_0 +unsupported`, out.String())

	b, err := os.ReadFile(filepath.Join(dir, "testplugin.perf.json"))
	require.NoError(t, err)
	var rep conformance.PerfReport
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Len(t, rep.Results, 2)
	assert.Equal(t, "declared", rep.PeakGBpsSource)
	assert.Positive(t, rep.Results[1].GBps)

	out.Reset()
	errb.Reset()
	rc = run([]string{"conform", "--perf", "--plugin", filepath.Join(dir, "libxpu-none.so"), "--report", ""}, &out, &errb)
	assert.Equal(t, 1, rc)
	assert.Contains(t, out.String(), "FAIL [error] cannot open")
}
