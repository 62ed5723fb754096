package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/sched"
)

// Every --spec mode prints plain decoding's greedy text; --stats reports the passes.
func TestRunSpecModes(t *testing.T) {
	p := storiesPath(t)
	requirePlugins(t, "neon")
	t.Setenv("XPU_CACHE_DIR", t.TempDir())
	prompt := "Lily and Tom played in the park. Lily and Tom"
	base := []string{"run", "--model", p, "--temp", "0", "-n", "48", "--backend", "neon", "-p", prompt}
	code, want, errOut := runCLI(t, append(base, "--spec", "off")...)
	require.Equal(t, 0, code, errOut)
	for _, args := range [][]string{
		{"--spec", "retrieval", "--stats"},
		{"--spec", "lookup", "--stats", "--spec-always"},
		{"--spec", "retrieval", "--spec-task", "tales", "--spec-lengths", "4,12"},
		{"--stats"},
	} {
		code, out, errOut := runCLI(t, append(base, args...)...)
		require.Equal(t, 0, code, errOut)
		assert.Equal(t, want, out, "%v", args)
		if strings.Contains(strings.Join(args, " "), "--stats") {
			assert.Regexp(t, regexp.MustCompile(`speculative: [0-9.]+ tokens/pass over \d+ passes`), errOut, "%v", args)
			assert.Contains(t, errOut, "time: draft")
			assert.Regexp(t, regexp.MustCompile(`decode cpu: [0-9.]+ ms, [0-9.]+ µs per token`), errOut, "%v", args)
		}
	}
	// the task's answer was stored
	files, err := filepath.Glob(filepath.Join(os.Getenv("XPU_CACHE_DIR"), "spec", "tales-*.hist"))
	require.NoError(t, err)
	require.Len(t, files, 1)
	// a corrupt store is reported, and the run goes on
	require.NoError(t, os.WriteFile(files[0], []byte("garbage"), 0o644))
	code, out, errOut := runCLI(t, append(base, "--spec", "retrieval", "--spec-task", "tales")...)
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, want, out)
	assert.Contains(t, errOut, "corrupt history store")
}

// The trace shows the verify passes on a track of their own, with what each accepted.
func TestRunSpecTrace(t *testing.T) {
	p := storiesPath(t)
	requirePlugins(t, "neon")
	trace := filepath.Join(t.TempDir(), "t.json")
	code, _, errOut := runCLI(t, "run", "--model", p, "--temp", "0", "-n", "48", "--backend", "neon",
		"--spec", "lookup", "--spec-always", "--trace", trace, "-p", "Lily and Tom played in the park. Lily and Tom")
	require.Equal(t, 0, code, errOut)
	events, err := sched.ReadTraceFile(trace)
	require.NoError(t, err)
	verifies := 0
	for _, e := range events {
		if e.Track == "speculative" && strings.HasPrefix(e.Name, "verify ") {
			verifies++
			assert.Contains(t, e.Args, "accepted")
		}
	}
	assert.Positive(t, verifies)
}

func TestRunSpecBadFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--spec", "eagle"}, `--spec "eagle"`},
		{[]string{"--spec-lengths", "1,8"}, "--spec-lengths"},
		{[]string{"--spec-lengths", "x"}, "--spec-lengths"},
	} {
		code, _, errOut := runCLI(t, append([]string{"run", "--model", "x.gguf"}, tt.args...)...)
		assert.Equal(t, 2, code, tt.args)
		assert.Contains(t, errOut, tt.want)
	}
}

// The README's speculative-decoding line, run as written.
func TestREADMESpecCommand(t *testing.T) {
	storiesPath(t)
	lines := readmeLinesWhere(t, func(l string) bool { return strings.Contains(l, "build/xpu run") && strings.Contains(l, "--spec") })
	require.NotEmpty(t, lines)
	for _, l := range lines {
		out, errOut := runDocLine(t, l, []string{"XPU_CACHE_DIR=" + t.TempDir()})
		assert.Contains(t, out+errOut, "tokens/pass", l)
	}
}

// A context shorter than the default verify lengths backs off (auto drops the lengths that do
// not fit, and turns off when none does) instead of failing the run; lengths or a mode the
// user asked for that cannot fit are a clear usage error.
func TestRunSpecShortContext(t *testing.T) {
	p := storiesPath(t)
	base := []string{"run", "--model", p, "--temp", "0", "-n", "4", "--backend", "ref", "-p", "Once"}
	runCLICases(t, base, []cliCase{
		{args: []string{"-c", "8"}, says: "decode: 4 tokens"},
		{args: []string{"-c", "8", "--spec", "retrieval", "--stats"}, says: "decode: 4 tokens"},
		{args: []string{"-c", "3", "--no-context-shift"}, says: "(stop: context)"},
		{args: []string{"-c", "3"}, says: "decode: 4 tokens"}, // the context shifts
		{args: []string{"-c", "3", "--spec", "retrieval"}, code: 2, says: "--spec retrieval: the context length 3 is shorter than every verify length (4,8,16,32)"},
		{args: []string{"-c", "8", "--spec-lengths", "4,16"}, code: 2, says: "--spec-lengths 4,16: verify lengths must be at most the context length 8"},
	}, func(t *testing.T, c cliCase, out, _ string) {
		if c.code == 0 {
			assert.True(t, strings.HasPrefix(out, "Once"), out)
		}
	})
}
