package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm/gguf"
)

func TestQuantizeCommand(t *testing.T) {
	model := storiesPath(t)
	dir := t.TempDir()
	q8 := filepath.Join(dir, "q8.gguf")
	code, out, errOut := runCLI(t, "quantize", "--type", "q8_0", model, q8)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, q8+": q8_0, 48 tensors (f32 16, q8_0 32), 32 quantized, 5 fallbacks")
	assert.Empty(t, errOut, "no progress drawn into a pipe")
	st, err := os.Stat(q8)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), st.Mode().Perm())

	runCLICases(t, nil, []cliCase{
		{"no files", []string{"quantize"}, 2, "usage: xpu quantize"},
		{"unknown type", []string{"quantize", "--type", "q4_k_xl", model, filepath.Join(dir, "x.gguf")}, 1, "q4_k_m, q5_k_m"},
		{"output is input", []string{"quantize", q8, q8}, 1, "overwrite the input"},
		{"absent input", []string{"quantize", filepath.Join(dir, "absent.gguf"), filepath.Join(dir, "y.gguf")}, 1, "absent.gguf"},
		{"requantize refused", []string{"quantize", "--type", "q4_0", q8, filepath.Join(dir, "z.gguf")}, 1, "already q8_0"},
	})
	// A failed run leaves no output and no temporary file behind.
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1)

	code, out, errOut = runCLI(t, "quantize", "--type", "q4_0", "--allow-requantize", q8, filepath.Join(dir, "z.gguf"))
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "q4_0, 48 tensors (f32 16, q4_0 32)")
}

// gen-model writes K-quant matrices when every row fits their 256-value blocks, and refuses a
// preset whose rows do not.
func TestGenModelKQuant(t *testing.T) {
	out := filepath.Join(t.TempDir(), "q3k.gguf")
	code, stdout, errOut := runCLI(t, "gen-model", "--params", "6M", "--type", "q3_k", "-o", out) // the quickest K-quant to write
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, stdout, "q3_k")
	f, err := gguf.Open(out)
	require.NoError(t, err)
	defer f.Close()
	ti, ok := f.Tensor("blk.0.ffn_down.weight")
	require.True(t, ok)
	assert.Equal(t, gguf.GGMLTypeQ3_K, ti.Type)

	code, _, errOut = runCLI(t, "gen-model", "--params", "15M", "--type", "q4_k", "-o", out)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "multiples of 256")
}
