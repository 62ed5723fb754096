package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/loader"
)

// Every wrong combination of run's flags says what is wrong on the first line, then the usage.
func TestRunFlagCombinations(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.txt")
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"run"}, "no model"},
		{[]string{"run", "-p", "hi"}, "no model"},
		{[]string{"run", "a.gguf", "b.gguf"}, "one model, got 2 arguments"},
		{[]string{"run", "-m", "a.gguf", "b.gguf"}, "given twice"},
		{[]string{"run", "a.gguf", "--backend", "neon", "--policy", "prefer-cpu"}, "give one"},
		{[]string{"run", "a.gguf", "-p", "hi", "-f", "x.txt"}, "--prompt and --file"},
	} {
		code, _, errOut := runCLI(t, tc.args...)
		assert.Equal(t, 2, code, "%v: %s", tc.args, errOut)
		first, _, _ := strings.Cut(errOut, "\n")
		assert.Contains(t, first, tc.says, "%v", tc.args)
		assert.Contains(t, errOut, "usage: xpu run", "%v", tc.args)
	}
	code, _, errOut := runCLI(t, "run", "a.gguf", "-f", missing)
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--file")
	assert.Contains(t, errOut, "missing.txt")
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "version"} {
		code, out, _ := runCLI(t, arg)
		assert.Equal(t, 0, code)
		assert.Regexp(t, `^xpu \S+ go1\.\d+`, out)
	}
}

// The README's llama-cli style command: a positional model, -p -n -s -t -c, and the prompt
// from a file or standard input gives the same text.
func TestRunLlamaCLIFlags(t *testing.T) {
	model := storiesPath(t)
	code, out, errOut := runCLI(t, "run", model, "-p", "Once upon a time", "-n", "16", "-s", "7",
		"-t", "1", "-c", "128", "--temp", "0", "--backend", "ref")
	require.Equal(t, 0, code, errOut)
	assert.True(t, strings.HasPrefix(out, "Once upon a time"), out)
	assert.Contains(t, errOut, "decode: 16 tokens")

	file := filepath.Join(t.TempDir(), "prompt.txt")
	require.NoError(t, os.WriteFile(file, []byte("Once upon a time"), 0o644))
	code, fromFile, errOut := runCLI(t, "run", "-f", file, "-n", "16", "--temp", "0", "--backend", "ref", model)
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, out, fromFile)

	old := stdin
	stdin = strings.NewReader("Once upon a time")
	defer func() { stdin = old }()
	code, fromStdin, errOut := runCLI(t, "run", model, "-f", "-", "-n", "16", "--temp", "0", "--backend", "ref")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, out, fromStdin)
}

// --stop ends the text before the stop string (a word of the published greedy text).
func TestRunStop(t *testing.T) {
	model := storiesPath(t)
	want, err := os.ReadFile(filepath.Join(filepath.Dir(model), "stories260K.greedy.txt"))
	require.NoError(t, err)
	stop := " was"
	i := strings.Index(string(want), stop)
	require.Positive(t, i)
	code, out, errOut := runCLI(t, "run", model, "--temp", "0", "-n", "256", "--backend", "ref",
		"--stop", "no such text", "--stop", stop)
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, string(want[:i])+"\n", out)
	assert.Contains(t, errOut, "stop: stop-string")
}

// A seed drawn from the clock is printed, and giving it back repeats the text.
func TestRunSeedPrinted(t *testing.T) {
	model := storiesPath(t)
	code, out, errOut := runCLI(t, "run", model, "-n", "24", "--temp", "1", "--backend", "ref")
	require.Equal(t, 0, code, errOut)
	m := regexp.MustCompile(`seed: (\d+)`).FindStringSubmatch(errOut)
	require.NotNil(t, m, errOut)
	code, again, errOut := runCLI(t, "run", model, "-n", "24", "--temp", "1", "--backend", "ref", "-s", m[1])
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, out, again)
	assert.NotContains(t, errOut, "seed:", "a given seed is not drawn")
}

// Without --backend the device is the best usable plugin device, not the reference.
func TestRunDefaultDevice(t *testing.T) {
	model := storiesPath(t)
	cands, err := loader.Discover(context.Background())
	require.NoError(t, err)
	plugins := false
	for _, c := range cands {
		plugins = plugins || (c.Chosen && c.Score > 0)
	}
	if !plugins {
		if names := required.Names(); len(names) > 0 {
			t.Fatalf("%s=%s requires plugins, but none was found usable", required.Env, strings.Join(names, ","))
		}
		t.Skip("no plugin built (make all): the default device has nothing to choose from")
	}
	code, _, errOut := runCLI(t, "run", model, "--temp", "0", "-n", "8")
	require.Equal(t, 0, code, errOut)
	line := regexp.MustCompile(`load: .* on (\S+), `).FindStringSubmatch(errOut)
	require.NotNil(t, line, errOut)
	assert.NotEqual(t, "ref:0", line[1])
}

// Each flag, long or alias, lands in its group, and validation fills what the run derives:
// the default policy, whether the reference may run, and speculative decoding off under a
// grammar.
func TestParseRunFlagGroups(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		check func(t *testing.T, f *runFlags)
	}{
		{"input aliases", []string{"-m", "a.gguf", "-p", "hi", "--stop", "x", "--stop", "y", "--cnv"}, func(t *testing.T, f *runFlags) {
			assert.Equal(t, "a.gguf", f.in.model)
			assert.Equal(t, "hi", f.in.prompt)
			assert.Equal(t, stringList{"x", "y"}, f.in.stops)
			assert.True(t, f.in.chat)
		}},
		{"sampling aliases", []string{"a.gguf", "-s", "7", "--temp", "0", "-n", "3"}, func(t *testing.T, f *runFlags) {
			assert.Equal(t, uint64(7), f.smp.sampler().Seed)
			assert.Zero(t, f.smp.sampler().Temperature)
			assert.Equal(t, 3, f.smp.n)
		}},
		{"context", []string{"a.gguf", "-c", "128", "--keep", "-1", "--no-context-shift", "-ctk", "q8_0"}, func(t *testing.T, f *runFlags) {
			assert.Equal(t, 128, f.kv.ctxLen)
			assert.Empty(t, f.kv.generateOptions(), "no context shift")
			assert.Len(t, f.kv.runnerOptions(), 3, "KV types, chunk and context length")
		}},
		{"default placement", []string{"a.gguf", "-t", "2"}, func(t *testing.T, f *runFlags) {
			assert.Equal(t, "max-performance", f.place.policy)
			assert.False(t, f.place.allowRef)
			assert.False(t, f.place.planned())
			assert.Equal(t, 2, f.place.threads)
		}},
		{"named backend", []string{"a.gguf", "--backend", "ref", "--isolated"}, func(t *testing.T, f *runFlags) {
			assert.Empty(t, f.place.policy)
			assert.True(t, f.place.allowRef)
			assert.Len(t, f.place.loaderOptions(), 2, "isolated and the execute timeout")
		}},
		{"units", []string{"a.gguf", "--units", "ref,ref"}, func(t *testing.T, f *runFlags) {
			assert.True(t, f.place.planned())
		}},
		{"grammar turns auto spec off", []string{"a.gguf", "--grammar", `root ::= "a"`}, func(t *testing.T, f *runFlags) {
			assert.NotNil(t, f.grammar)
			assert.Equal(t, "off", *f.spec.mode)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var errOut strings.Builder
			f, code, ok := parseRunFlags(tc.args, &errOut)
			require.True(t, ok, "exit %d: %s", code, errOut.String())
			tc.check(t, f)
		})
	}
}
