package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readmeShellLines returns the lines of the README's ```sh blocks.
func readmeShellLines(t *testing.T) []string {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	var out []string
	in := false
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
		case strings.HasPrefix(line, "```"):
			in = false
		case in && line != "":
			out = append(out, line)
		}
	}
	return out
}

// The README's llama-cli style `xpu run` lines and its `xpu serve` + curl lines, run as
// written (from the repository root, build/xpu being the binary this test builds).
func TestREADMERunAndServeCommands(t *testing.T) {
	storiesPath(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	bin := buildXPU(t)
	var runs, serves, curls []string
	for _, l := range readmeShellLines(t) {
		switch {
		case strings.Contains(l, "build/xpu run ../shared/"):
			runs = append(runs, l)
		case strings.HasPrefix(l, "build/xpu serve "):
			serves = append(serves, l)
		case strings.HasPrefix(l, "curl "):
			curls = append(curls, l)
		}
	}
	require.Len(t, runs, 2, "the README's llama-cli style run lines")
	require.Len(t, serves, 1)
	require.NotEmpty(t, curls)
	for _, l := range runs {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, "bash", "-c", strings.ReplaceAll(l, "build/xpu", bin))
		cmd.Dir = root
		out, err := cmd.Output()
		cancel()
		var ee *exec.ExitError
		if err != nil && errors.As(err, &ee) {
			t.Fatalf("%s: %v\n%s", l, err, ee.Stderr)
		}
		require.NoError(t, err, l)
		assert.True(t, strings.HasPrefix(string(out), "Once upon a time"), "%s: %q", l, out)
	}

	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed (scripts/deps.sh installs it): the README's curl line is not run")
	}
	args := strings.Fields(strings.TrimPrefix(serves[0], "build/xpu serve "))
	for i, a := range args {
		if a == "--port" {
			args[i+1] = "0"
		}
	}
	p := startServeIn(t, root, args...)
	host := strings.TrimPrefix(p.url, "http://")
	for _, l := range curls {
		out, err := exec.Command("bash", "-c", strings.ReplaceAll(l, "127.0.0.1:8080", host)).Output()
		require.NoError(t, err, l)
		var resp struct {
			Choices []struct {
				Message struct{ Role, Content string }
			}
		}
		require.NoError(t, json.Unmarshal(out, &resp), "%s", out)
		require.Len(t, resp.Choices, 1, "%s", out)
		assert.Equal(t, "assistant", resp.Choices[0].Message.Role)
		assert.NotEmpty(t, resp.Choices[0].Message.Content)
	}
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, <-p.exited)
}

// The README's xpu quantize lines, run as written except that the quantized file goes to a
// temporary folder instead of the repository root.
func TestREADMEQuantizeCommands(t *testing.T) {
	storiesPath(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	bin := buildXPU(t)
	out := filepath.Join(t.TempDir(), "stories260K-q4_k_m.gguf")
	var lines []string
	for _, l := range readmeShellLines(t) {
		if strings.Contains(l, "stories260K-q4_k_m.gguf") {
			lines = append(lines, l)
		}
	}
	require.Len(t, lines, 2, "the README's quantize and run lines")
	require.True(t, strings.HasPrefix(lines[0], "build/xpu quantize "), lines[0])
	for i, l := range lines {
		l = strings.ReplaceAll(strings.ReplaceAll(l, "build/xpu", bin), "stories260K-q4_k_m.gguf", out)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, "bash", "-c", l)
		cmd.Dir = root
		got, err := cmd.Output()
		cancel()
		var ee *exec.ExitError
		if err != nil && errors.As(err, &ee) {
			t.Fatalf("%s: %v\n%s", l, err, ee.Stderr)
		}
		require.NoError(t, err, l)
		if i == 0 {
			assert.Contains(t, string(got), "q4_k_m, 48 tensors (f32 16, q8_0 32)")
		} else {
			assert.True(t, strings.HasPrefix(string(got), "Once upon a time"), "%s: %q", l, got)
		}
	}
}

// The README's W8A8 lines, run as written (the npu-int8 copy in a temporary folder, the cache
// there too): the copy, the calibration into the cache, greedy text with the int8 work on the
// emulated NPU, and the NMSE table.
func TestREADMEW8A8Commands(t *testing.T) {
	storiesPath(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	bin := buildXPU(t)
	dir := t.TempDir()
	npu := filepath.Join(dir, "stories260K-npu.gguf")
	var lines []string
	for _, l := range readmeShellLines(t) {
		if strings.Contains(l, "stories260K-npu.gguf") || strings.HasPrefix(l, "build/xpu calibrate ") || strings.HasPrefix(l, "build/xpu w8a8-eval ") {
			lines = append(lines, l)
		}
	}
	require.Len(t, lines, 4, "the README's W8A8 lines")
	for _, l := range lines {
		l = strings.ReplaceAll(strings.ReplaceAll(l, "build/xpu", bin), "stories260K-npu.gguf", npu)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, "bash", "-c", l)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "XPU_CACHE_DIR="+filepath.Join(dir, "cache"))
		got, err := cmd.Output()
		cancel()
		var ee *exec.ExitError
		if err != nil && errors.As(err, &ee) {
			t.Fatalf("%s: %v\n%s", l, err, ee.Stderr)
		}
		require.NoError(t, err, l)
		switch {
		case strings.Contains(l, " run "):
			assert.True(t, strings.HasPrefix(string(got), "Once upon a time"), "%s: %q", l, got)
		case strings.Contains(l, " w8a8-eval "):
			assert.Contains(t, string(got), "w8a8 shadow pruned (per-tensor)")
			assert.Contains(t, string(got), "64/64", "greedy W8A8 matches F32 for 64 tokens")
		case strings.Contains(l, " calibrate "):
			assert.Contains(t, string(got), filepath.Join(dir, "cache", "w8a8"))
		}
	}
}
