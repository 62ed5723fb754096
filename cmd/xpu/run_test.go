package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/synth"
)

func storiesPath(t *testing.T) string {
	p := filepath.Join("..", "..", "..", "shared", "models", "stories260K.gguf")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("test model absent: %v", err)
	}
	return p
}

func TestRunStoriesGreedyOnReference(t *testing.T) {
	p := storiesPath(t)
	want, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stories260K.greedy.txt"))
	require.NoError(t, err)
	// 32 tokens keep the test quick; llm's tests check all 256.
	code, out, errOut := runCLI(t, "run", "--model", p, "--temp", "0", "-n", "32", "--backend", "ref")
	require.Equal(t, 0, code, errOut)
	require.True(t, strings.HasSuffix(out, "\n"))
	assert.True(t, strings.HasPrefix(string(want), strings.TrimSuffix(out, "\n")), out)
	assert.Greater(t, len(out), 80)
	for _, s := range []string{"load:", "prefill:", "decode: 32 tokens", "tok/s"} {
		assert.Contains(t, errOut, s)
	}
}

func TestRunByPolicy(t *testing.T) {
	p := storiesPath(t)
	code, out, errOut := runCLI(t, "run", "--model", p, "--temp", "0", "-n", "8", "--policy", "prefer-cpu")
	require.Equal(t, 0, code, errOut)
	assert.True(t, strings.HasPrefix(out, "Once upon a time"), out)
	assert.Regexp(t, `weights on [a-z]+:\d+`, errOut)

	code, _, errOut = runCLI(t, "run", "--model", p, "--policy", "no-such-policy")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "ranks no device")
}

func TestRunErrors(t *testing.T) {
	runCLICases(t, nil, []cliCase{
		{"no model", []string{"run"}, 2, "usage"},
		{"backend and policy", []string{"run", "--model", "x", "--backend", "ref", "--policy", "prefer-cpu"}, 2, "usage"},
		{"missing file", []string{"run", "--model", filepath.Join(t.TempDir(), "none.gguf")}, 1, "no such file"},
		{"not gguf", []string{"run", "--model", "run_test.go"}, 1, "bad magic"},
		{"negative threads", []string{"run", "--model", "x", "--threads", "-2"}, 2, "--threads -2"},
		// checked before the model is opened ("x" does not exist): one line, exit 2
		{"NaN temperature", []string{"run", "--model", "x", "--temp", "NaN"}, 2, "temperature NaN"},
		{"top-p 2", []string{"run", "--model", "x", "--top-p", "2"}, 2, "top-p 2"},
		{"negative tokens", []string{"run", "--model", "x", "-n", "-5"}, 2, "-n -5"},
		{"negative top-k", []string{"run", "--model", "x", "--top-k", "-1"}, 2, "top-k -1"},
		{"infinite repeat penalty", []string{"run", "--model", "x", "--repeat-penalty", "Inf"}, 2, "repeat penalty +Inf"},
		{"chunk 0", []string{"run", "--model", "x", "--chunk", "0"}, 2, "--chunk 0"},
		{"negative context", []string{"run", "--model", "x", "--ctx", "-1"}, 2, "--ctx -1"},
		{"negative device", []string{"run", "--model", "x", "--device", "-1"}, 2, "--device -1"},
	}, func(t *testing.T, c cliCase, _, errOut string) {
		if c.code == 2 && c.says != "usage" {
			assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
		}
	})
}

func TestGenModelThenRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	code, out, errOut := runCLI(t, "gen-model", "--arch", "qwen2", "--params", "260K", "--type", "q8_0", "-o", path)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "qwen2")
	code, _, errOut = runCLI(t, "run", "--model", path, "--prompt", "hi", "-n", "4", "--seed", "5", "--backend", "ref", "--chunk", "2")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, errOut, "decode:")

	code, _, errOut = runCLI(t, "gen-model", "--params", "13B", "-o", path)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "13B")
}

// nanModel writes the synthetic 260K llama model with element 0 of tensor name set to NaN.
func nanModel(t *testing.T, name string) string {
	spec, err := synth.Preset("llama", "260K", core.F32, 3)
	require.NoError(t, err)
	f, err := synth.Parse(spec)
	require.NoError(t, err)
	var ts []gguf.WriteTensor
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		data := append([]byte(nil), f.TensorData(ti)...)
		if ti.Name == name {
			xs := core.DecodeF32(data)
			xs[0] = float32(math.NaN())
			data = core.EncodeF32(xs)
		}
		ts = append(ts, gguf.WriteTensor{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, Data: data})
	}
	p := filepath.Join(t.TempDir(), "nan.gguf")
	out, err := os.Create(p)
	require.NoError(t, err)
	require.NoError(t, gguf.Write(out, f.KV, ts))
	require.NoError(t, out.Close())
	return p
}

// TestRunNonFiniteModelFails: a NaN weight used to give empty text and exit 0.
func TestRunNonFiniteModelFails(t *testing.T) {
	p := nanModel(t, "blk.3.ffn_up.weight")
	args := []string{"run", "--model", p, "--prompt", "hi", "-n", "4", "--backend", "ref"}
	code, _, errOut := runCLI(t, args...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "xpu run: llm: non-finite values: logit")

	t.Setenv("XPU_LOG", "debug") // the stage-by-stage check names the layer
	code, _, errOut = runCLI(t, args...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "stage 4 (layer 3): output x")
}
