package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStartArguments: bad settings are refused before anything runs.
func TestStartArguments(t *testing.T) {
	for _, c := range []struct {
		name string
		env  []string
		says string
	}{
		{"rounds not a number", []string{"ROUNDS=few"}, "ROUNDS=few"},
		{"zero tokens", []string{"N=0"}, "N=0"},
		{"no xpu", []string{"XPU=/nonexistent/xpu"}, "no xpu binary"},
		{"no llama-simple", []string{"LLAMA_BIN=" + t.TempDir()}, "no executable llama-simple"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := os.Stat(filepath.Join("..", "build", "xpu")); err != nil && c.name != "no xpu" {
				t.Skipf("build/xpu absent (run make all first): %v", err)
			}
			code, out, errOut := runBenchScript(t, "bench/start.sh", time.Minute, c.env, "/nonexistent/model.gguf")
			assert.Equal(t, 2, code, errOut)
			assert.Empty(t, out)
			assert.Contains(t, errOut, c.says)
		})
	}
}

// TestStartTable runs the harness on the test model beside a stand-in llama-simple: a row per
// program with the medians and the ratio to llama-simple, and with RECORD=1 both xpu figures
// stored.
func TestStartTable(t *testing.T) {
	model := modelAndXPU(t)
	if _, err := os.Stat("/usr/bin/time"); err != nil {
		t.Skip("GNU time absent")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go is not on PATH (record_result runs lab/perfgen)")
	}
	bin := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bin, "llama-simple"), []byte("#!/usr/bin/env bash\nsleep 0.01\n"), 0o755))
	results := t.TempDir()
	env := []string{"LLAMA_BIN=" + bin, "ROUNDS=2", "RECORD=1", "BENCH_RESULTS=" + results}
	code, out, errOut := runBenchScript(t, "bench/start.sh", 3*time.Minute, env, model)
	require.Equal(t, 0, code, errOut)
	num := `[0-9]+\.[0-9]+`
	assert.Regexp(t, regexp.MustCompile(`\| stories260K \| llama-simple \| `+num+` \| `+num+` \| 1\.00 \| `), out)
	assert.Regexp(t, regexp.MustCompile(`\| stories260K \| xpu \| `+num+` \| `+num+` \| `+num+` \| `), out)
	b, err := os.ReadFile(filepath.Join(results, "startup.jsonl"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Len(t, lines, 2, "%s", b)
	assert.Contains(t, lines[0], `"name":"stories260K xpu run -n 1, wall"`)
	assert.Contains(t, lines[0], `"note":"llama-simple: `)
	assert.Contains(t, lines[1], `"name":"stories260K xpu run -n 1, peak RSS"`)
	assert.Contains(t, lines[1], `"note":"model file 1.1 MiB; llama-simple: `)
}
