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
)

// `xpu conform --compare` exits 1 and names the case when a report got worse, 0 when not, 2
// when a report cannot be read.
func TestConformCompare(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	require.Equal(t, 0, run([]string{"conform", "--plugin", "ref", "--filter", `^RELU\(dtype=f32`, "--report", dir}, &out, &errb),
		errb.String())
	oldPath := filepath.Join(dir, "ref.json")
	rep, err := conformance.ReadReport(oldPath)
	require.NoError(t, err)
	require.NotEmpty(t, rep.Cases)
	// the planted regression: the first case fails in the "new" report
	rep.Cases[0].Status, rep.Cases[0].Category, rep.Cases[0].Errors = conformance.StatusFail, conformance.CatNaN,
		[]string{"NaN at 8"}
	b, err := json.Marshal(rep)
	require.NoError(t, err)
	newPath := filepath.Join(dir, "ref-new.json")
	require.NoError(t, os.WriteFile(newPath, b, 0o644))

	tests := []struct {
		name string
		args []string
		rc   int
		want string
	}{
		{"regression", []string{oldPath, newPath}, 1, "REGRESSION now-failing: " + rep.Cases[0].Name + ": [nan] NaN at 8\n1 regressions\n"},
		{"same", []string{oldPath, oldPath}, 0, "no regressions\n"},
		{"improvement", []string{newPath, oldPath}, 0, "no regressions\n"},
		{"unreadable", []string{oldPath, filepath.Join(dir, "ref.md")}, 2, ""},
		{"one file", []string{oldPath}, 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			rc := run(append([]string{"conform", "--compare"}, tt.args...), &out, &errb)
			assert.Equal(t, tt.rc, rc, "stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
			if tt.rc == 2 {
				assert.NotEmpty(t, errb.String())
				return
			}
			assert.Equal(t, tt.want, out.String())
		})
	}
}
