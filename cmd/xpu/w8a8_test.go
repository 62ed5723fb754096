package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/w8a8"
)

// The W8A8 workflow through the CLI: an outlier model, its npu-int8 copy, a calibration in the
// cache, and the errors for what is missing or stale.
func TestW8A8Commands(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XPU_CACHE_DIR", filepath.Join(dir, "cache"))
	model := filepath.Join(dir, "q.gguf")
	code, out, errOut := runCLI(t, "gen-model", "--arch", "qwen2", "--params", "260K", "--type", "f32", "--outliers", "3", "-o", model)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "outlier channels: [")
	other := filepath.Join(dir, "other.gguf")
	code, _, errOut = runCLI(t, "gen-model", "--arch", "qwen2", "--params", "260K", "--type", "f32", "--seed", "2", "-o", other)
	require.Equal(t, 0, code, errOut)

	npu := filepath.Join(dir, "q-npu.gguf")
	code, out, errOut = runCLI(t, "quantize", "--npu-int8", "--per-channel", model, npu)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "npu-int8 per channel, 35 matrices given int8 weights")
	f, err := gguf.Open(npu)
	require.NoError(t, err)
	_, ok := f.Tensor("blk.4.ffn_down.weight" + w8a8.SuffixCodes)
	assert.True(t, ok)
	require.NoError(t, f.Close())

	code, out, errOut = runCLI(t, "calibrate", model, "--no-importance", "--tokens", "48")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, filepath.Join(dir, "cache", "w8a8"))
	calFile := filepath.Join(dir, "cal.json")
	code, _, errOut = runCLI(t, "calibrate", "-m", model, "--no-importance", "--tokens", "48", "-o", calFile)
	require.Equal(t, 0, code, errOut)
	_, err = os.Stat(calFile)
	require.NoError(t, err)

	runCLICases(t, nil, []cliCase{
		{"gen-model outliers beyond dim/8", []string{"gen-model", "--arch", "qwen2", "--params", "260K", "--outliers", "9", "-o", filepath.Join(dir, "x.gguf")}, 1, "outlier channels"},
		{"npu-int8 with a type", []string{"quantize", "--npu-int8", "--type", "q8_0", model, filepath.Join(dir, "y.gguf")}, 2, "--npu-int8 keeps"},
		{"per-channel alone", []string{"quantize", "--per-channel", model, filepath.Join(dir, "y.gguf")}, 2, "--per-channel goes with --npu-int8"},
		{"npu-int8 twice", []string{"quantize", "--npu-int8", npu, filepath.Join(dir, "y.gguf")}, 1, "already has NPU int8 weights"},
		{"calibrate: too few tokens", []string{"calibrate", model, "--tokens", "3"}, 2, "at least 8"},
		{"calibrate: bad keep", []string{"calibrate", model, "--keep", "2"}, 2, "keep in [0, 1]"},
		{"run: shadow mode", []string{"run", "-m", model, "--w8a8", "--shadow", "some"}, 2, "--shadow \"some\""},
		{"run: calib without w8a8", []string{"run", "-m", model, "--calib", calFile}, 2, "go with --w8a8"},
		{"run: no calibration", []string{"run", "-m", other, "--w8a8", "--backend", "ref", "-n", "1"}, 1, "no calibration for this model"},
		{"run: stale calibration", []string{"run", "-m", other, "--w8a8", "--calib", calFile, "--backend", "ref", "-n", "1", "--w8a8-convert"}, 1, "belongs to another model"},
		{"run: no int8 weights", []string{"run", "-m", model, "--w8a8", "--backend", "ref", "-n", "1"}, 1, "--w8a8-convert"},
	})
}
