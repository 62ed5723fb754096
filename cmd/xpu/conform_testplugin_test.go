package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/loader/plugintest"
)

// backendLine is conform's per-backend summary: "== name: P passed, F failed, U unsupported, ..."
var backendLine = regexp.MustCompile(`(?m)^== [^ ]+: (\d+ passed, \d+ failed, \d+ unsupported),`)

// The project's smallest plugin passes the whole suite through the CLI, and the CLI's counts
// agree with themselves when a plugin fails at the end of a run (its context cannot close,
// then it cannot shut down): the failure has a FAIL line and a rerun command, and the
// backend's line counts what the last line counts.
func TestConformTestPlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds plugins and runs the whole suite: not in -short")
	}
	dir := t.TempDir()
	tests := []struct {
		name     string
		defines  []string
		filter   string
		rc       int
		failed   string // the last line's failed count
		contains []string
	}{
		{"intact", nil, "", 0, "0 failed", nil},
		{"context leak", []string{"MUT_CTX_LEAK"}, `^RELU\(dtype=f32,shape=\[17\]\)$`, 1, "2 failed",
			[]string{"ABI(context-close-at-end): FAIL [error]", "rerun: xpu conform --plugin ",
				"FAIL [error] closing the backend"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sub := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-"))
			require.NoError(t, os.Mkdir(sub, 0o755))
			path := plugintest.Build(t, sub, "testplugin", "", tt.defines...)
			args := []string{"conform", "--plugin", path, "--report", filepath.Join(sub, "reports")}
			if tt.filter != "" {
				args = append(args, "--filter", tt.filter)
			}
			rc, out, errOut := runCLI(t, args...)
			assert.Equal(t, tt.rc, rc, "stdout:\n%s\nstderr:\n%s", out, errOut)
			last := lastLine(out)
			require.Regexp(t, summaryLine, last)
			assert.Contains(t, last, tt.failed)
			m := backendLine.FindStringSubmatch(out)
			require.NotNil(t, m, out)
			assert.Equal(t, last, m[1], "the backend's line and the last line disagree")
			for _, s := range tt.contains {
				assert.Contains(t, out, s)
			}
		})
	}
}

// A plugin whose name is ".." writes its reports inside --report, not beside it.
func TestConformReportNameIsSanitized(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a plugin: not in -short")
	}
	parent := t.TempDir()
	path := plugintest.Build(t, t.TempDir(), "dotdot", "", `TP_NAME=".."`)
	reports := filepath.Join(parent, "reports")
	rc, out, errOut := runCLI(t, "conform", "--plugin", path, "--filter", `^ABI\(probe-info\)$`, "--report", reports)
	assert.Equal(t, 0, rc, "stdout:\n%s\nstderr:\n%s", out, errOut)
	entries, err := os.ReadDir(parent)
	require.NoError(t, err)
	require.Len(t, entries, 1, "nothing beside the report folder")
	_, err = os.Stat(filepath.Join(reports, "backend.json"))
	assert.NoError(t, err)
}
