package main

import (
	"encoding/csv"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm/llmbench"
)

func TestBenchFlagErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.gguf")
	runCLICases(t, []string{"bench"}, []cliCase{
		{"help", []string{"-h"}, 0, "xpu bench -m MODEL"},
		{"model and kernels", []string{"-m", "x.gguf", "--kernels"}, 2, "two different benchmarks"},
		{"kernel flag with -m", []string{"-m", "x.gguf", "--quick"}, 2, "--quick belongs to the kernel suite"},
		{"harness with -m", []string{"-m", "x.gguf", "--harness", ""}, 2, "--harness belongs"},
		{"model flag without -m", []string{"-p", "128"}, 2, "-p needs -m MODEL"},
		{"output without -m", []string{"--kernels", "-o", "json"}, 2, "-o needs -m MODEL"},
		{"positional", []string{"x.gguf"}, 2, `unexpected argument "x.gguf"`},
		{"bad list", []string{"-m", "x.gguf", "-p", "128,abc"}, 2, "invalid value"},
		{"negative count", []string{"-m", "x.gguf", "-n", "-4"}, 2, "invalid value"},
		{"bad pair", []string{"-m", "x.gguf", "-pg", "512"}, 2, "want PROMPT,GEN"},
		{"zero pair", []string{"-m", "x.gguf", "-pg", "0,8"}, 2, "want PROMPT,GEN"},
		{"unknown format", []string{"-m", "x.gguf", "-o", "xml"}, 2, "unknown output format"},
		{"no reps", []string{"-m", "x.gguf", "-r", "0"}, 2, "at least one repetition"},
		{"no tests", []string{"-m", "x.gguf", "-p", "0", "-n", "0"}, 2, "no test to run"},
		{"kv dtype", []string{"-m", "x.gguf", "--kv", "q5_1"}, 2, "want one of f32, f16, q8_0, q4_0"},
		{"k dtype", []string{"-m", "x.gguf", "-ctk", "f16,i8"}, 2, "--ctk"},
		{"zero chunk", []string{"-m", "x.gguf", "--chunk", "0"}, 2, "--chunk 0"},
		{"backend and policy", []string{"-m", "x.gguf", "--backend", "ref", "--policy", "prefer-cpu"}, 2, "give one"},
		{"missing model", []string{"-m", missing, "--backend", "ref"}, 1, "no such file"},
		{"kernels: one thread count", []string{"--kernels", "--threads", "1,2"}, 2, "one thread count"},
		{"kernels: unknown backend", []string{"--kernels", "--backend", "no-such-backend"}, 1, "no-such-backend"},
	})
}

// The three output formats on the test model: the same tests, in llama-bench's shapes.
func TestBenchModelFormats(t *testing.T) {
	p := storiesPath(t)
	base := []string{"bench", "-m", p, "-p", "16", "-n", "4", "-d", "0,8", "-r", "2", "-t", "1", "--chunk", "8", "--backend", "ref"}
	names := []string{"pp16", "tg4", "pp16 @ d8", "tg4 @ d8"}

	code, out, errOut := runCLI(t, append(base, "-o", "md")...)
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2+len(names), out)
	assert.Contains(t, lines[0], "| test | t/s |")
	for i, n := range names {
		assert.Regexp(t, `^\| llama 293K F32 \| 1\.12 MiB \| 292\.80 K \| ref:0 \| 1 \| 8 \| f16 \| `+n+` \| [0-9.]+ ± [0-9.]+ \|$`, lines[2+i])
	}
	assert.Contains(t, errOut, "prepared in")

	code, out, errOut = runCLI(t, append(base, "-o", "json", "-ctk", "f32", "-ctv", "f16")...)
	require.Equal(t, 0, code, errOut)
	// llmbench's own tests pin the llama-bench field names; this one checks the flags reach them.
	var recs []llmbench.Record
	require.NoError(t, json.Unmarshal([]byte(out), &recs), out)
	require.Len(t, recs, len(names))
	want := [][3]int{{16, 0, 0}, {0, 4, 0}, {16, 0, 8}, {0, 4, 8}}
	for i, r := range recs {
		assert.Equal(t, want[i], [3]int{r.NPrompt, r.NGen, r.NDepth})
		assert.Equal(t, [2]string{"f32", "f16"}, [2]string{r.TypeK, r.TypeV})
		assert.Len(t, r.SamplesNs, 2)
		assert.Len(t, r.SamplesTs, 2)
		assert.Positive(t, r.AvgTs)
	}

	code, out, errOut = runCLI(t, append(base, "-o", "csv", "-t", "1,2", "-d", "0")...)
	require.Equal(t, 0, code, errOut)
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	require.NoError(t, err, out)
	require.Len(t, rows, 1+4, "header + 2 tests × 2 thread counts")
	assert.Equal(t, "model_filename", rows[0][0])
	threads := []string{}
	for _, r := range rows[1:] {
		threads = append(threads, r[6])
	}
	assert.Equal(t, []string{"1", "1", "2", "2"}, threads)
}
