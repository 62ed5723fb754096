package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The README's sparse lines, run as written except that the model goes to a temporary folder:
// gen-model reports the sparsity it measured, close to the one asked for and skewed;
// plan-sparse writes the sidecar with a held-out recall of at least 0.9 per layer; run decodes
// sparsely from it (reading cold bundles, with stats) and densely with --sparse off; sparse-eval
// finds the oracle's logits equal to dense within the bundles' requantization and the trained
// predictor's recall where plan-sparse measured it.
func TestREADMESparseCommands(t *testing.T) {
	model := filepath.Join(t.TempDir(), "relu-6m.gguf")
	lines := readmeLinesWhere(t, func(l string) bool { return strings.Contains(l, "/tmp/relu-6m.gguf") })
	require.Len(t, lines, 5, "the README's gen-model, plan-sparse, run (sparse, dense) and sparse-eval lines")
	var outs, errs []string
	for _, l := range lines {
		out, errOut := runDocLine(t, l, nil, "/tmp/relu-6m.gguf", model)
		outs, errs = append(outs, out), append(errs, errOut)
	}
	m := regexp.MustCompile(`sparsity ([0-9.]+) .*top 10% of neurons carry ([0-9]+)%`).FindStringSubmatch(outs[0])
	require.NotNil(t, m, outs[0])
	sp, _ := strconv.ParseFloat(m[1], 64)
	top, _ := strconv.Atoi(m[2])
	assert.InDelta(t, 0.9, sp, 0.03, outs[0])
	assert.Greater(t, top, 40, "skew: %s", outs[0])

	rows := regexp.MustCompile(`(?m)^\s+(\d+)\s+([0-9.]+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)$`).FindAllStringSubmatch(outs[1], -1)
	require.Len(t, rows, 8, outs[1])
	for _, r := range rows {
		rec, _ := strconv.ParseFloat(r[4], 64)
		assert.GreaterOrEqual(t, rec, 0.9, "layer %s recall: %s", r[1], outs[1])
	}
	mp := regexp.MustCompile(`mean\s+recall ([0-9.]+)\s+precision ([0-9.]+)`).FindStringSubmatch(outs[1])
	require.NotNil(t, mp, outs[1])
	prec, _ := strconv.ParseFloat(mp[2], 64)
	assert.Greater(t, prec, 0.5, "the predictor must do far better than predicting everything (the svd fit gives about 0.75 here): %s", outs[1])
	assert.Contains(t, outs[1], model+".sparse.gguf")

	// run: sparse with stats, then dense; both generate their 32 tokens.
	assert.Contains(t, errs[2], "sparse FFN: "+model+".sparse.gguf")
	checkSparseRunStats(t, errs[2])
	// The README's sidecar budget (5 MiB) is below the model: the fixed region is pinned (or the
	// system said why not) and the prompt runs on the decode programs.
	assert.Regexp(t, `fixed region (pinned in memory|not pinned)`, errs[2])
	assert.Contains(t, errs[2], "one token at a time")
	assert.NotContains(t, errs[3], "sparse FFN")
	for _, o := range outs[2:4] {
		assert.NotEmpty(t, strings.TrimSpace(o))
	}

	// sparse-eval: the oracle is dense up to the Q8_0 down columns' requantization.
	ev := regexp.MustCompile(`(?m)^(trained|oracle)\s+(\S+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+(\d+)/(\d+)$`).FindAllStringSubmatch(outs[4], -1)
	require.Len(t, ev, 2, outs[4])
	for _, r := range ev {
		nmse, err := strconv.ParseFloat(r[2], 64)
		require.NoError(t, err, r[0])
		recall, _ := strconv.ParseFloat(r[4], 64)
		agree, _ := strconv.ParseFloat(r[3], 64)
		switch r[1] {
		case "oracle":
			assert.Less(t, nmse, 1e-3, r[0])
			assert.GreaterOrEqual(t, recall, 0.999, r[0])
			assert.GreaterOrEqual(t, agree, 0.95, r[0])
		case "trained":
			assert.Less(t, nmse, 0.5, r[0])
			assert.GreaterOrEqual(t, recall, 0.8, r[0])
		}
	}
}

func TestPlanSparseErrors(t *testing.T) {
	model := filepath.Join(t.TempDir(), "m.gguf")
	code, _, errOut := runCLI(t, "gen-model", "--params", "260K", "--type", "f32", "-o", model)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = runCLI(t, "plan-sparse", "--model", model, "--budget", "1GiB")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "relu")

	relu := filepath.Join(t.TempDir(), "r.gguf")
	code, _, errOut = runCLI(t, "gen-model", "--params", "260K", "--type", "f32", "--act", "relu", "--sparsity", "0.8", "--measure", "0", "-o", relu)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = runCLI(t, "plan-sparse", "--model", relu, "--budget", "10KiB")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "fixed region")
	code, _, errOut = runCLI(t, "plan-sparse", "--model", relu, "--budget", "lots")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "2GiB")
	code, _, _ = runCLI(t, "plan-sparse", "--model", relu)
	assert.Equal(t, 2, code)
	code, _, errOut = runCLI(t, "gen-model", "--params", "260K", "--act", "gelu", "-o", relu)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "gelu")
	code, _, errOut = runCLI(t, "gen-model", "--params", "260K", "--sparsity", "0.5", "--skew", "pareto", "-o", relu)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "pareto")
}

// checkSparseRunStats checks run --stats' sparse FFN lines: the cache and the disk were used.
func checkSparseRunStats(t *testing.T, stderr string) {
	t.Helper()
	for _, want := range []string{"hit", "read", "recall", "I/O wait"} {
		assert.Contains(t, stderr, want, stderr)
	}
}

// run's sparse FFN refuses what it cannot run, naming the problem, and --sparse off always
// works.
func TestRunSparseErrors(t *testing.T) {
	dir := t.TempDir()
	relu := filepath.Join(dir, "r.gguf")
	code, _, errOut := runCLI(t, "gen-model", "--params", "260K", "--type", "f32", "--act", "relu", "--sparsity", "0.8", "--measure", "0", "-o", relu)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = runCLI(t, "plan-sparse", "--model", relu, "--budget", "4MiB", "--ctx", "64", "--tokens", "32", "--epochs", "2")
	require.Equal(t, 0, code, errOut)
	other := filepath.Join(dir, "o.gguf")
	code, _, errOut = runCLI(t, "gen-model", "--params", "260K", "--type", "f32", "--act", "relu", "--sparsity", "0.8", "--measure", "0", "--seed", "7", "-o", other)
	require.Equal(t, 0, code, errOut)
	truncated := filepath.Join(dir, "t.sparse.gguf")
	b, err := os.ReadFile(relu + ".sparse.gguf")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(truncated, b[:len(b)-5000], 0o644))

	base := []string{"run", "--temp", "0", "-n", "4", "-c", "64", "-p", "a b c"}
	runCLICases(t, base, []cliCase{
		{"bad mode", []string{"--model", relu, "--sparse", "maybe"}, 2, "on, off or auto"},
		{"bad predictor", []string{"--model", relu, "--predictor", "psychic"}, 2, "trained or oracle"},
		{"bad budget", []string{"--model", relu, "--budget", "lots"}, 2, "--budget"},
		{"bad eviction", []string{"--model", relu, "--eviction", "mru"}, 2, "lru or lfu"},
		{"bad threshold offset", []string{"--model", relu, "--threshold-offset", "NaN"}, 2, "finite"},
		{"bad readers", []string{"--model", relu, "--io-readers", "0"}, 2, "1 to 64"},
		{"bad gap", []string{"--model", relu, "--io-gap", "-1"}, 2, "--io-gap"},
		{"bad pin", []string{"--model", relu, "--pin-fixed", "maybe"}, 2, "on, off or auto"},
		{"no gap, pinned, chunked", []string{"--model", relu, "--io-gap", "0", "--pin-fixed", "on", "--chunk", "4", "--stats"}, 0, "fixed region"},
		{"lfu, offset, one reader, no look-ahead", []string{"--model", relu, "--eviction", "lfu", "--threshold-offset", "0.5",
			"--io-readers", "1", "--prefetch=false"}, 0, ""},
		{"no sidecar", []string{"--model", other, "--sparse", "on"}, 1, "plan-sparse"},
		{"sidecar of another model", []string{"--model", other, "--sidecar", relu + ".sparse.gguf"}, 1, "hash"},
		{"truncated sidecar", []string{"--model", relu, "--sidecar", truncated}, 1, "t.sparse.gguf"},
		{"budget below the fixed region", []string{"--model", relu, "--budget", "1KiB"}, 1, "fixed region"},
		{"with speculation", []string{"--model", relu, "--spec", "retrieval"}, 1, "--sparse off"},
		{"dense always works", []string{"--model", relu, "--sparse", "off", "--spec", "retrieval"}, 0, ""},
		{"dense without a sidecar", []string{"--model", other}, 0, ""},
	})
}
