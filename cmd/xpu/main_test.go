package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// cliCase is one command line and what it must give: the exit code and a part of stderr.
type cliCase struct {
	name string // the subtest's name; "" names it by its arguments
	args []string
	code int
	says string
}

// runCLICases runs each case, its arguments after prefix, as a subtest, and then the checks in
// also on its output.
func runCLICases(t *testing.T, prefix []string, cases []cliCase, also ...func(t *testing.T, c cliCase, stdout, stderr string)) {
	t.Helper()
	for _, c := range cases {
		name := c.name
		if name == "" {
			name = strings.Join(c.args, " ")
		}
		t.Run(name, func(t *testing.T) {
			code, out, errOut := runCLI(t, append(append([]string(nil), prefix...), c.args...)...)
			assert.Equal(t, c.code, code, errOut)
			assert.Contains(t, errOut, c.says)
			for _, check := range also {
				check(t, c, out, errOut)
			}
		})
	}
}

func TestUsageAndUnknown(t *testing.T) {
	code, out, _ := runCLI(t)
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "devices")
	assert.NotContains(t, out, "plugin-host", "hidden commands stay out of the usage")
	code, _, errOut := runCLI(t, "frobnicate")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `unknown command "frobnicate"`)
}

func TestSubcommandFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		says string // on stderr
	}{
		{[]string{"devices", "-h"}, 0, "usage"},
		{[]string{"demo", "-h"}, 0, "usage"},
		{[]string{"run", "-h"}, 0, "usage"},
		{[]string{"devices", "--no-such-flag"}, 2, "flag provided but not defined"},
		{[]string{"demo", "--tokens", "x"}, 2, "invalid value"},
		{[]string{"demo", "--dim", "-64"}, 2, "between 0 and"},
		{[]string{"demo", "--tokens", "100000000"}, 2, "between 0 and"},
		{[]string{"demo", "--runs", "-3"}, 2, "--runs -3"},
	} {
		code, _, errOut := runCLI(t, tc.args...)
		assert.Equal(t, tc.code, code, "%v: %s", tc.args, errOut)
		assert.Contains(t, strings.ToLower(errOut), tc.says, "%v", tc.args)
	}
}

func TestDevicesJSONListsReference(t *testing.T) {
	code, out, errOut := runCLI(t, "devices", "--json")
	require.Equal(t, 0, code, errOut)
	var rows []deviceRow
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.NotEmpty(t, rows)
	assert.Equal(t, "ref", rows[0].Backend)
	assert.True(t, rows[0].Chosen)
}

// A folder of broken plugins must not stop `xpu devices -v`: each file is named with a reason.
func TestDevicesBrokenPluginsVerbose(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "libxpu-text.so"), []byte("not a library"), 0o644))
	t.Setenv("XPU_PLUGIN_PATH", dir)
	code, out, errOut := runCLI(t, "devices", "-v")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "libxpu-text.so")
	assert.Contains(t, out, "not a shared library")
}

// TestDemoAgreesWithReference: every device that runs the block must be within the
// TOLERANCES.md transformer-block row for its weight type (demo exits 1 and says MISMATCH
// otherwise; TestDemoVerdictFailsOnDisagreement plants the faults).
func TestDemoAgreesWithReference(t *testing.T) {
	for _, wt := range []string{"f32", "q8_0"} {
		t.Run(wt, func(t *testing.T) {
			code, out, errOut := runCLI(t, "demo", "--tokens", "3", "--dim", "64", "--runs", "1", "--weights", wt)
			require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
			assert.Contains(t, out, "ref:0")
			judged := 0
			for _, line := range strings.Split(out, "\n") {
				assert.NotContains(t, line, "error:", "a device failed (not merely unsupported)")
				assert.NotContains(t, line, "MISMATCH")
				if f := strings.Fields(line); len(f) >= 6 && f[5] == "ok" {
					judged++
				}
			}
			assert.Positive(t, judged, "no device was judged:\n%s", out)
		})
	}
}
