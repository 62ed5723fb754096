package bench

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestVsLlamaCppWithIkLlama: given IK_LLAMA_BIN, ik_llama.cpp runs in every round beside
// llama.cpp and xpu, and gets its own table (xpu/ik_llama.cpp); a bad IK_LLAMA_BIN is refused
// before anything runs.
func TestVsLlamaCppWithIkLlama(t *testing.T) {
	fake := fakeLlamaBench(t, true)
	for _, c := range []struct {
		name, ik, says string
	}{
		{"not a folder", "/nonexistent/ik_llama.cpp/bin", "IK_LLAMA_BIN=/nonexistent/ik_llama.cpp/bin is not a folder"},
		{"no llama-bench", t.TempDir(), "no executable llama-bench in IK_LLAMA_BIN"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runScript(t, []string{"LLAMA_BIN=" + fake, "IK_LLAMA_BIN=" + c.ik})
			assert.Equal(t, 2, code, errOut)
			assert.Empty(t, out)
			assert.Contains(t, errOut, c.says)
		})
	}

	model := modelAndXPU(t)
	if _, err := exec.LookPath("jq"); err != nil {
		t.Skip("jq absent (scripts/deps.sh installs it)")
	}
	out := t.TempDir()
	env := []string{"LLAMA_BIN=" + fake, "IK_LLAMA_BIN=" + fakeLlamaBench(t, false), "OUT=" + out,
		"ROUNDS=2", "REPS=1", "PP=16", "TG=4", "DEPTH=8", "THREADS=1"}
	code, stdout, errOut := runScript(t, env, model)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, stdout, "## xpu vs llama.cpp and ik_llama.cpp")
	assert.Contains(t, stdout, "ik_llama.cpp fake (depth: pg)")
	assert.Contains(t, stdout, "| model | test | llama.cpp t/s | xpu t/s | xpu/llama.cpp |")
	assert.Contains(t, stdout, "| model | test | ik_llama.cpp t/s | xpu t/s | xpu/ik_llama.cpp |")
	num := `[0-9]+\.[0-9]{2}`
	// the llama.cpp fake knows -d (decode at depth runs at its tg rate); the ik_llama.cpp one
	// does not, so its depth row comes from -pg minus -p
	for _, row := range []struct{ test, rate string }{
		{"pp16", "100.00"}, {"tg4", "50.00"}, {"tg4 @ d8", "50.00"}, {"tg4 @ d8", "40.00"},
	} {
		re := `\| stories260K \| ` + regexp.QuoteMeta(row.test) + ` \| ` + row.rate + ` \| ` + num + ` \| \*\*` + num + `\*\* \| `
		assert.Regexp(t, re, stdout, "row %s at %s", row.test, row.rate)
	}
	logs, err := filepath.Glob(filepath.Join(out, "ik-llama-stories260K-r*.json"))
	require.NoError(t, err)
	assert.Len(t, logs, 2, "one ik_llama.cpp run per round")
}

// TestVsLlamaCppBusy: BUSY=1 measures every contender again at 1 and 2 threads beside a busy
// loop on one core, in a second table, and stops the loop afterwards.
func TestVsLlamaCppBusy(t *testing.T) {
	model := modelAndXPU(t)
	if _, err := exec.LookPath("jq"); err != nil {
		t.Skip("jq absent (scripts/deps.sh installs it)")
	}
	env := []string{"LLAMA_BIN=" + fakeLlamaBench(t, true), "OUT=" + t.TempDir(), "BUSY=1",
		"ROUNDS=1", "REPS=1", "PP=16", "TG=4", "DEPTH=0", "THREADS=2"}
	code, stdout, errOut := runScript(t, env, model)
	require.Equal(t, 0, code, errOut)
	quiet, busy, found := strings.Cut(stdout, "### Beside a busy loop on one core")
	require.True(t, found, stdout)
	assert.Contains(t, quiet, "| stories260K | tg4 | 50.00 |")
	num := `[0-9]+\.[0-9]{2}`
	for _, test := range []string{"pp16, 1 thread", "tg4, 1 thread", "pp16, 2 threads", "tg4, 2 threads"} {
		assert.Regexp(t, `\| stories260K \| `+regexp.QuoteMeta(test)+` \| `+num+` \| `+num+` \| \*\*`+num+`\*\* \| `, busy, test)
	}
	out, err := exec.Command("pgrep", "-f", "while :; do :; done").Output()
	assert.Error(t, err, "the busy loop outlived the script: %s", out)
}
