package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// libSh runs script in bash with bench/lib.sh sourced, from the repository root.
func libSh(t *testing.T, env []string, script string) string {
	t.Helper()
	cmd := exec.Command("bash", "-c", "set -euo pipefail; . bench/lib.sh; "+script)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

func TestLibMedian(t *testing.T) {
	tests := []struct{ in, want string }{
		{"3\n1\n2\n", "2\n"},
		{"4\n1\n3\n2\n", "2.5\n"},
		{"10\n9.5\n", "9.75\n"},
		{"7\n", "7\n"},
		{"", ""},
		{"1e3\n20\n300\n", "300\n"}, // numeric order, not text order
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, libSh(t, nil, "printf '"+strings.ReplaceAll(tt.in, "\n", `\n`)+"' | median"), "%q", tt.in)
	}
}

// Every item runs once a round, and the order rotates so no item is always first.
func TestLibInterleave(t *testing.T) {
	out := libSh(t, nil, `f() { echo "$1 $2"; }; interleave 3 f a b c`)
	assert.Equal(t, "1 a\n1 b\n1 c\n2 b\n2 c\n2 a\n3 c\n3 a\n3 b\n", out)
}

func TestLibMachineAndLoad(t *testing.T) {
	out := libSh(t, []string{"BENCH_BANDWIDTH=0"}, `machine; load_line before; load1`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	assert.Regexp(t, `\(\d+ cores\), (avx512|avx2|portable|arm64 neon(\+dotprod)?|neon .+, int8: .+)$`, lines[0])
	assert.Regexp(t, `^load before: [0-9.]+ [0-9.]+ [0-9.]+$`, lines[1])
	assert.Regexp(t, `^[0-9.]+$`, lines[2])
}

// record_result stores a figure through lab/perfgen; a second record of the same figure replaces it.
func TestLibRecord(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go is not on PATH")
	}
	dir := t.TempDir()
	env := []string{"BENCH_BANDWIDTH=0", "BENCH_RESULTS=" + dir}
	libSh(t, env, `record_result llm "tg128" 10 tok/s "bench/x.sh"; record_result llm "tg128" 12 tok/s "bench/x.sh"`)
	b, err := os.ReadFile(filepath.Join(dir, "llm.jsonl"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Len(t, lines, 1, "%s", b)
	assert.Contains(t, lines[0], `"value":"12"`)
	assert.Contains(t, lines[0], `"command":"bench/x.sh"`)
	assert.Regexp(t, `"date":"\d{4}-\d{2}-\d{2}"`, lines[0])
}
