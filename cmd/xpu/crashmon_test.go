package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/loader/plugintest"
)

// A plugin that segfaults in process takes xpu down, but the last lines say which plugin it was
// and how to run it isolated (the crash monitor), not only the Go runtime's report.
func TestPluginCrashNamesPlugin(t *testing.T) {
	plugintest.CC(t)
	dir := t.TempDir()
	path := plugintest.Build(t, dir, "crashy", "", "TP_FAULT=1", `TP_NAME="crashy"`)
	code, _, errOut := cliChild(t, 2*time.Minute, []string{"XPU_CACHE_DIR=" + t.TempDir()}, "conform", "--plugin", path)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "SIGSEGV")
	tail := errOut[max(0, len(errOut)-600):]
	assert.Contains(t, tail, "xpu: the plugin "+path+" crashed the process")
	assert.Contains(t, tail, "--isolated")
	assert.Contains(t, tail, "XPU_ISOLATE=crashy")

}

// The monitor's reading of a report: the faulting PC inside a loaded plugin's mapping names
// it; a crash outside Go without a PC in one names the loaded plugins; a Go panic, or no
// report at all, adds nothing.
func TestCrashHint(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	ranges := mappedRanges(os.Getpid(), exe)
	require.NotEmpty(t, ranges, "this test binary is mapped")
	inside := ranges[0].lo + 16
	for _, tc := range []struct {
		name, report string
		plugins      []string
		says         string // "" : no message
	}{
		{"fault in a plugin", fmt.Sprintf("SIGSEGV: segmentation violation\nPC=0x%x m=3 sigcode=1 addr=0x0\nsignal arrived during external code execution\n", inside),
			[]string{exe}, "xpu: the plugin " + exe + " crashed the process"},
		{"fault elsewhere outside Go", "SIGSEGV: segmentation violation\nPC=0x10 m=3 sigcode=1\nsignal arrived during external code execution\n",
			[]string{exe}, "crashed in code outside Go, probably a plugin (loaded: " + exe + ")"},
		{"Go panic", "panic: runtime error: index out of range\n\ngoroutine 1 [running]:\n", []string{exe}, ""},
		{"no report", "", []string{exe}, ""},
		{"no plugin", "SIGSEGV: segmentation violation\nPC=0x10 m=3 sigcode=1\nsignal arrived during external code execution\n", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.report
			for _, p := range tc.plugins {
				in = pluginLine + p + "\n" + in
			}
			var w strings.Builder
			crashMonitor(strings.NewReader(in), &w, os.Getpid())
			if tc.says == "" {
				assert.Empty(t, w.String())
				return
			}
			assert.Contains(t, w.String(), tc.says)
			assert.Contains(t, w.String(), "--isolated")
		})
	}
}
