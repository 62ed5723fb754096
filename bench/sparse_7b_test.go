package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runSparse7B runs bench/sparse-7b.sh (see runBenchScript).
func runSparse7B(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runBenchScript(t, "bench/sparse-7b.sh", time.Minute, env, args...)
}

// The settings are checked before the script touches the cgroup or the page cache, so these
// refusals need neither root nor a model.
func TestSparse7BRejectsBadSettings(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want string
	}{
		{"zero rounds", []string{"ROUNDS=0"}, "ROUNDS=0"},
		{"tokens not a number", []string{"N=eight"}, "N=eight"},
		{"unknown mode", []string{"MODE=tight"}, "MODE=tight"},
		{"unknown configuration", []string{"CONFIGS=llama turbo"}, "unknown configuration turbo"},
		{"empty configurations", []string{"CONFIGS= "}, "CONFIGS is empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runSparse7B(t, tc.env)
			assert.Equal(t, 2, code)
			assert.Contains(t, stderr, tc.want)
		})
	}
}

// --table reads an earlier results.tsv: medians over the rounds of the finished runs, the
// ratios of the medians with the per-round range, and the runs that did not finish counted.
func TestSparse7BTable(t *testing.T) {
	head := "mode\tround\tconfig\tmodel\ttokens\ttok_s\twall_s\tmajflt\tmaxrss_kib\tmax_usage\tfailcnt\toom_kills\tstatus\tload_before\tload_after\tshared\tread_bytes\n"
	row := func(round, config, tps, status, shared string) string {
		return strings.Join([]string{"limit", round, config, "/m/" + config + ".gguf", "8", tps, "10.0", "80", "1000",
			"1048576000", "5", "0", status, "1.5", "2.5", shared, "8388608"}, "\t") + "\n"
	}
	tsv := head +
		row("1", "llama", "1.0", "ok", "") + row("1", "dense", "2.0", "ok", "") + row("1", "sparse", "3.0", "ok", "") +
		row("2", "llama", "2.0", "ok", "") + row("2", "dense", "2.0", "ok", "") + row("2", "sparse", "8.0", "ok", "shared") +
		row("3", "llama", "0", "timeout", "") + row("3", "dense", "4.0", "ok", "") + row("3", "sparse", "6.0", "ok", "")
	f := filepath.Join(t.TempDir(), "results.tsv")
	require.NoError(t, os.WriteFile(f, []byte(tsv), 0o644))

	code, out, stderr := runSparse7B(t, nil, "--table", f)
	require.Equal(t, 0, code, stderr)
	// llama: median of 1 and 2 (the timeout has no rate); dense: of 2, 2, 4; sparse: of 3, 8, 6
	assert.Regexp(t, `\| limit \| llama \| llama \| 1\.500 \| 8 \|.*\| 1000 \|.*2× ok, 1× timeout`, out)
	assert.Regexp(t, `\| limit \| dense \| dense \| 2\.000 \|`, out)
	assert.Regexp(t, `\| limit \| sparse \| sparse \| 6\.000 \|.*1× model open elsewhere`, out)
	// 6/1.5 and 6/2; per round sparse/llama 3 and 4 (round 3's llama timed out)
	assert.Contains(t, out, "| limit | sparse/llama | **4.00** | 3.00–4.00 |")
	assert.Contains(t, out, "| limit | sparse/dense | **3.00** | 1.50–4.00 |")
	assert.Contains(t, out, "| limit | dense/llama | **1.33** | 1.00–2.00 |")
}
