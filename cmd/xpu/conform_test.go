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

	"github.com/xpuhub/xpu/internal/required"
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
	for _, ext := range []string{".json", ".md", ".xml", ".html"} {
		_, err := os.Stat(filepath.Join(dir, "ref"+ext))
		assert.NoError(t, err, "report ref%s", ext)
	}
}

// TestConformAllMustFindBackends: `conform --all` used to pass with nothing to test (every
// OpenCL check skipped when the plugin probed 0, exit 0 when no backend was found at all).
func TestConformAllMustFindBackends(t *testing.T) {
	neon, err := filepath.Abs(filepath.Join("..", "..", "build", "plugins", "libxpu-neon.so"))
	require.NoError(t, err)
	t.Chdir(t.TempDir()) // out of the module: no build/plugins is searched
	tests := []struct {
		name, pluginPath, require string
		rc                        int
		lines                     []string
	}{
		{"nothing found", "", "", 1, []string{"== FAIL [error] --all found no backend", "0 passed, 1 failed, 0 unsupported"}},
		{"nothing found, nothing required", t.TempDir(), "", 1, []string{"found no backend"}},
		{"required backend missing", neon, "neon,opencl", 1,
			[]string{"== opencl: FAIL [error] required by XPU_REQUIRE_BACKENDS=neon,opencl but not found", "9 passed, 1 failed"}},
		{"every required backend found", neon, "neon", 0, []string{"9 passed, 0 failed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.pluginPath == neon {
				if _, err := os.Stat(neon); err != nil {
					required.Skip(t, "neon", "%s is not built: %v", neon, err)
				}
			}
			t.Setenv("XPU_PLUGIN_PATH", tt.pluginPath)
			t.Setenv("XPU_REQUIRE_BACKENDS", tt.require)
			var out, errb bytes.Buffer
			rc := run([]string{"conform", "--all", "--report", "", "--filter", `^RELU\(dtype=f32`}, &out, &errb)
			assert.Equal(t, tt.rc, rc, "stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
			for _, l := range tt.lines {
				assert.Contains(t, out.String(), l)
			}
			require.Regexp(t, summaryLine, lastLine(out.String()))
		})
	}
}
