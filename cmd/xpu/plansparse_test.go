package main

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The README's sparse lines, run as written except that the model goes to a temporary folder:
// gen-model reports the sparsity it measured, close to the one asked for and skewed, and
// plan-sparse writes the sidecar with a held-out recall of at least 0.9 per layer.
func TestREADMESparseCommands(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	bin := buildXPU(t)
	model := filepath.Join(t.TempDir(), "relu-6m.gguf")
	var lines []string
	for _, l := range readmeShellLines(t) {
		if strings.Contains(l, "/tmp/relu-6m.gguf") {
			lines = append(lines, l)
		}
	}
	require.Len(t, lines, 2, "the README's gen-model and plan-sparse lines")
	var outs []string
	for _, l := range lines {
		l = strings.ReplaceAll(strings.ReplaceAll(l, "build/xpu", bin), "/tmp/relu-6m.gguf", model)
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		cmd := exec.CommandContext(ctx, "bash", "-c", l)
		cmd.Dir = root
		got, err := cmd.Output()
		cancel()
		var ee *exec.ExitError
		if err != nil && errors.As(err, &ee) {
			t.Fatalf("%s: %v\n%s", l, err, ee.Stderr)
		}
		require.NoError(t, err, l)
		outs = append(outs, string(got))
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
	assert.Greater(t, prec, 0.3, "the predictor must do better than predicting everything: %s", outs[1])
	assert.Contains(t, outs[1], model+".sparse.gguf")
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
