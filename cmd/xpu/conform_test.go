package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var summaryLine = regexp.MustCompile(`^\d+ passed, \d+ failed, \d+ unsupported$`)

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

func TestConformCommand(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		rc   int
		last string // exact last line of stdout, "" = any summary line
	}{
		{"reference subset", []string{"conform", "--plugin", "ref", "--filter", `^RELU\(dtype=f32`, "--report", dir}, 0,
			"9 passed, 0 failed, 0 unsupported"},
		{"missing plugin", []string{"conform", "--report", "", "--plugin", filepath.Join(dir, "libxpu-none.so")}, 1,
			"0 passed, 1 failed, 0 unsupported"},
		{"no backend named", []string{"conform"}, 2, ""},
		{"bad filter", []string{"conform", "--plugin", "ref", "--filter", "("}, 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			rc := run(tt.args, &out, &errb)
			assert.Equal(t, tt.rc, rc, "stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
			if tt.rc == 2 {
				assert.NotEmpty(t, errb.String())
				return
			}
			require.Regexp(t, summaryLine, lastLine(out.String()))
			if tt.last != "" {
				assert.Equal(t, tt.last, lastLine(out.String()))
			}
		})
	}
	for _, ext := range []string{".json", ".md", ".xml"} {
		_, err := os.Stat(filepath.Join(dir, "ref"+ext))
		assert.NoError(t, err, "report ref%s", ext)
	}
}
