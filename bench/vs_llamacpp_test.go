package bench

import (
	"context"
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

// runScript runs bench/vs-llamacpp.sh (see runBenchScript).
// modelAndXPU is the test model's absolute path, skipping the test where it or build/xpu (which
// every harness runs) is absent.
func modelAndXPU(t *testing.T) string {
	t.Helper()
	model, err := filepath.Abs(filepath.Join("..", "..", "shared", "models", "stories260K.gguf"))
	require.NoError(t, err)
	if _, err := os.Stat(model); err != nil {
		t.Skipf("test model absent: %v", err)
	}
	if _, err := os.Stat(filepath.Join("..", "build", "xpu")); err != nil {
		t.Skipf("build/xpu absent (run make all first): %v", err)
	}
	return model
}

func runScript(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runBenchScript(t, "bench/vs-llamacpp.sh", 2*time.Minute, env, args...)
}

// runBenchScript runs script from the repository root, within limit, with env added to a
// clean environment (so a LLAMA_BIN of the caller's cannot leak in; BENCH_BANDWIDTH=0 keeps
// lib.sh's machine line from measuring the read bandwidth), and returns its exit status and
// output.
func runBenchScript(t *testing.T, script string, limit time.Duration, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...)
	cmd.Dir = ".."
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "BENCH_BANDWIDTH=0"}, env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "%s hung", script)
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errb.String()
	}
	require.NoError(t, err)
	return 0, out.String(), errb.String()
}

// fakeLlamaBench writes a stand-in llama-bench into a new folder: it answers the options the
// script passes with llama-bench's JSON and fixed rates (pp 100 tok/s, tg 50 tok/s, and, in a
// pp+tg pair, decode at 40 tok/s after the prefill), so the test checks the script's reading and
// arithmetic, not llama.cpp. withDepth makes it one of the newer builds that know -d; withCLI
// adds a llama-cli whose timing line says 25 tok/s.
func fakeLlamaBench(t *testing.T, withDepth bool, withCLI ...bool) string {
	dir := t.TempDir()
	help := "usage: llama-bench [options]\n  -pg <pp,tg>\n"
	if withDepth {
		help += "  -d, --n-depth <n>\n"
	}
	script := `#!/usr/bin/env bash
if [[ "$1" == --help ]]; then printf '%s' "` + help + `"; exit 0; fi
P=512 N=128 D=0 PG=
while (($#)); do
	case "$1" in
	-p) P=$2; shift ;; -n) N=$2; shift ;; -d) D=$2; shift ;; -pg) PG=$2; shift ;;
	-m|-t|-r|-o) shift ;;
	esac
	shift
done
rows=()
row() { rows+=("{\"build_commit\":\"fake\",\"n_prompt\":$1,\"n_gen\":$2,\"n_depth\":$D,\"avg_ns\":$3,\"avg_ts\":$4}"); }
for p in ${P//,/ }; do ((p > 0)) && row "$p" 0 $((p * 10000000)) 100; done
for n in ${N//,/ }; do ((n > 0)) && row 0 "$n" $((n * 20000000)) 50; done
if [[ -n $PG ]]; then p=${PG%,*} n=${PG#*,}; ns=$((p * 10000000 + n * 25000000)); row "$p" "$n" "$ns" 0; fi
IFS=,; echo "[${rows[*]}]"
`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "llama-bench"), []byte(script), 0o755))
	if len(withCLI) > 0 && withCLI[0] {
		cli := `#!/usr/bin/env bash
N=0
while (($#)); do [[ "$1" == -n ]] && N=$2; shift; done
echo "llama_perf_context_print:        eval time =  $(((N - 1) * 40)).00 ms / $((N - 1)) runs   (   40.00 ms per token,    25.00 tokens per second)" >&2
`
		require.NoError(t, os.WriteFile(filepath.Join(dir, "llama-cli"), []byte(cli), 0o755))
	}
	return dir
}

func TestVsLlamaCppArguments(t *testing.T) {
	fake := fakeLlamaBench(t, false)
	cases := []struct {
		name string
		env  []string
		args []string
		says string
	}{
		{"no LLAMA_BIN", nil, nil, "LLAMA_BIN is not set"},
		{"LLAMA_BIN not a folder", []string{"LLAMA_BIN=/nonexistent/llama.cpp/bin"}, nil, "is not a folder"},
		{"no llama-bench", []string{"LLAMA_BIN=" + t.TempDir()}, nil, "no executable llama-bench"},
		{"rounds not a number", []string{"LLAMA_BIN=" + fake, "ROUNDS=three"}, nil, "ROUNDS=three"},
		{"zero threads", []string{"LLAMA_BIN=" + fake, "THREADS=0"}, nil, "THREADS=0"},
		{"negative depth", []string{"LLAMA_BIN=" + fake, "DEPTH=-1"}, nil, "DEPTH=-1"},
		{"no xpu", []string{"LLAMA_BIN=" + fake, "XPU=/nonexistent/xpu"}, nil, "no xpu binary"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runScript(t, c.env, c.args...)
			assert.Equal(t, 2, code, errOut)
			assert.Empty(t, out)
			assert.Contains(t, errOut, c.says)
		})
	}
	code, out, _ := runScript(t, nil, "--help")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "LLAMA_BIN")
}

// TestVsLlamaCppTable runs the whole script against the fake llama-bench and the real xpu
// binary on the test model: every depth method must give the fake's decode-at-depth rate, and
// every row must carry both programs' medians and their ratio.
func TestVsLlamaCppTable(t *testing.T) {
	model := modelAndXPU(t)
	if _, err := exec.LookPath("jq"); err != nil {
		t.Skip("jq absent (scripts/deps.sh installs it)")
	}
	for _, name := range []string{"pg", "native", "cli"} {
		native := name == "native"
		t.Run(name, func(t *testing.T) {
			results := t.TempDir()
			env := []string{"LLAMA_BIN=" + fakeLlamaBench(t, native, name == "cli"), "OUT=" + t.TempDir(), "ROUNDS=2",
				"REPS=1", "PP=16", "TG=4", "DEPTH=8", "THREADS=1", "RECORD=1", "BENCH_RESULTS=" + results}
			code, out, errOut := runScript(t, env, model)
			require.Equal(t, 0, code, errOut)
			assert.Contains(t, out, "depth: "+name)
			num := `[0-9]+\.[0-9]{2}`
			want := map[string]string{"pp16": "100.00", "tg4": "50.00", "tg4 @ d8": "40.00"}
			switch name {
			case "native":
				want["tg4 @ d8"] = "50.00" // -d runs the plain tg test at that depth
			case "cli":
				want["tg4 @ d8"] = "25.00" // llama-cli's own eval timing
			}
			for test, llama := range want {
				re := regexp.MustCompile(`\| stories260K \| ` + regexp.QuoteMeta(test) + ` \| ` + llama +
					` \| ` + num + ` \| \*\*` + num + `\*\* \| ` + num + `–` + num + ` \|`)
				assert.Regexp(t, re, out, "row %s", test)
			}
			// RECORD=1 stored each row's xpu figure, with llama.cpp's beside it
			b, err := os.ReadFile(filepath.Join(results, "llm.jsonl"))
			require.NoError(t, err)
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			require.Len(t, lines, 3, "%s", b)
			for i, test := range []string{"pp16", "tg4", "tg4 @ d8"} {
				assert.Contains(t, lines[i], `"name":"stories260K `+test+`, 1 threads"`)
				assert.Contains(t, lines[i], `"note":"llama.cpp fake: `+want[test])
			}
		})
	}
}
