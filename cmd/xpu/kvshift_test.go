package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunContextShift: a 300-token generation in a 128-token context goes on past the window
// with --keep 16 (the context shift is on by default, as llama.cpp's), and stops at the full
// context with --no-context-shift.
func TestRunContextShift(t *testing.T) {
	p := storiesPath(t)
	args := []string{"run", "-m", p, "-p", "Once upon a time", "-n", "300", "-c", "128", "--temp", "0", "--backend", "ref"}
	code, out, errOut := runCLI(t, append(args, "--keep", "16")...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, errOut, "decode: 300 tokens")
	assert.Contains(t, errOut, "(stop: max-tokens)")
	assert.Greater(t, len(out), 600, "300 tokens of text")

	code, _, errOut = runCLI(t, append(args, "--no-context-shift")...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, errOut, "(stop: context)")
}

// TestRunKVCacheTypes: the KV cache's dtypes and memory are printed at load (F16 by default;
// -ctk/-ctv, --cache-type-k/-v and --kv choose), and a bad or unfit dtype is a clear error.
func TestRunKVCacheTypes(t *testing.T) {
	p := storiesPath(t)
	base := []string{"run", "-m", p, "-n", "4", "--temp", "0", "-c", "64", "--backend", "ref"}
	for _, c := range []struct {
		flags []string
		says  string
	}{
		{nil, "kv cache: 40.0 KiB for 64 tokens (K f16: 20.0 KiB, V f16: 20.0 KiB;"},
		{[]string{"--kv", "f32"}, "(K f32: 40.0 KiB, V f32: 40.0 KiB;"},
		{[]string{"-ctk", "f32"}, "(K f32: 40.0 KiB, V f16: 20.0 KiB;"},
		{[]string{"--cache-type-v", "f32", "--kv", "f16"}, "(K f16: 20.0 KiB, V f32: 40.0 KiB;"},
	} {
		code, _, errOut := runCLI(t, append(base, c.flags...)...)
		require.Equal(t, 0, code, "%v: %s", c.flags, errOut)
		assert.Contains(t, errOut, c.says, "%v", c.flags)
	}
	code, _, errOut := runCLI(t, append(base, "-ctv", "q5_1")...)
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--cache-type-v")
	// stories260K's heads are 8 wide: no whole Q8_0 block
	code, _, errOut = runCLI(t, append(base, "-ctk", "q8_0")...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "multiple of 32")
	code, _, errOut = runCLI(t, append(base, "--keep", "-2")...)
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--keep -2")
}

// TestServeContextShift: `xpu serve -c 128` answers a 300-token request past its context
// (n_keep 16), printing the KV cache at load.
func TestServeContextShift(t *testing.T) {
	model := storiesPath(t)
	p := startServe(t, model, "--ctx", "128", "--backend", "ref", "-ctv", "f32")
	resp, err := http.Post(p.url+"/completion", "application/json", strings.NewReader(
		`{"prompt":"Once upon a time","n_predict":300,"n_keep":16,"temperature":0,"logit_bias":{"1":-100,"2":-100}}`))
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, string(b))
	var c struct {
		TokensPredicted int    `json:"tokens_predicted"`
		StopType        string `json:"stop_type"`
	}
	require.NoError(t, json.Unmarshal(b, &c))
	assert.Equal(t, 300, c.TokensPredicted)
	assert.Equal(t, "limit", c.StopType)
	assert.Contains(t, p.stderr.String(), "(K f16: 40.0 KiB, V f32: 80.0 KiB;")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, <-p.exited)
}
