package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched"
)

// requirePlugins skips the test unless the named plugins are built.
func requirePlugins(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		b, err := loader.Open(context.Background(), n)
		if err != nil {
			required.Skip(t, n, "backend %s not available (run make all): %v", n, err)
		}
		b.Close()
	}
}

// TestRunAcrossUnitsWithTrace is issue 11's acceptance run: stories260K across neon, opencl and
// qnn prints the published greedy text, and the trace shows all three units busy.
func TestRunAcrossUnitsWithTrace(t *testing.T) {
	p := storiesPath(t)
	requirePlugins(t, "neon", "opencl", "qnn")
	want, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stories260K.greedy.txt"))
	require.NoError(t, err)
	trace := filepath.Join(t.TempDir(), "t.json")
	code, out, errOut := runCLI(t, "run", "--model", p, "--temp", "0", "-n", "256", "--units", "neon,opencl,qnn",
		"--trace", trace)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, string(want), out)
	for _, s := range []string{"placement:", "MATMUL", "units:", "0 copies", "trace: " + trace} {
		assert.Contains(t, errOut, s)
	}

	events, err := sched.ReadTraceFile(trace)
	require.NoError(t, err)
	busy := map[string]float64{}
	tracks := map[string]bool{}
	for _, e := range events {
		tracks[e.Track] = true
		if e.Ph == "X" && !strings.HasPrefix(e.Name, "wait ") {
			busy[e.Track] += e.Dur
		}
	}
	for _, u := range []string{"neon:0", "opencl:0", "qnn:0"} {
		assert.Positive(t, busy[u], "unit %s is never busy in the trace (tracks %v)", u, tracks)
	}
}

func TestRunUnitsErrors(t *testing.T) {
	p := storiesPath(t)
	plan := filepath.Join(t.TempDir(), "plan.json")
	require.NoError(t, os.WriteFile(plan, []byte(`{"units":["ref"],"prefill":{"rules":[{"unit":"ref","ops":["MATMAL"]}]}}`), 0o644))
	runCLICases(t, nil, []cliCase{
		{"units and backend", []string{"run", "--model", p, "--units", "ref", "--backend", "ref"}, 2, "usage"},
		{"units and plan", []string{"run", "--model", p, "--units", "ref", "--plan", plan}, 2, "usage"},
		{"bad unit list", []string{"run", "--model", p, "--units", "neon{"}, 1, "bad unit spec"},
		{"unknown unit", []string{"run", "--model", p, "--units", "ref,gpu:7"}, 1, "no device gpu:7"},
		{"bad plan", []string{"run", "--model", p, "--plan", plan}, 1, "MATMAL"},
		{"missing plan", []string{"run", "--model", p, "--plan", plan + ".none"}, 1, "no such file"},
	})
}

// TestRunSplitPlanStats: stories260K with every MATMUL row-split over two pinned neon units
// prints the published greedy text, and --stats prints each phase's bubble rate.
func TestRunSplitPlanStats(t *testing.T) {
	p := storiesPath(t)
	requirePlugins(t, "neon")
	want, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stories260K.greedy.txt"))
	require.NoError(t, err)
	plan := filepath.Join(t.TempDir(), "plan.json")
	require.NoError(t, os.WriteFile(plan, []byte(`{"units":["neon{cpus=0,threads=1}","neon{cpus=1,threads=1}"],
		"prefill":{"rules":[{"ops":["MATMUL"],"split":{"strategy":"rows","units":["0","1"],"ratio":[0.5,0.5]}},{"unit":"0"}]}}`), 0o600))
	code, out, errOut := runCLI(t, "run", "--model", p, "--temp", "0", "-n", "256", "--plan", plan, "--stats")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, string(want), out)
	for _, s := range []string{"scheduling:", "prefill ", "decode ", "bubble rate", "neon:0{cpus=1;threads=1}"} {
		assert.Contains(t, errOut, s)
	}
}

// A unit option the backend does not know (a typo) is refused with the known ones, never
// silently ignored; threads, which the host passes to every unit (--threads), is accepted
// everywhere.
func TestUnknownUnitOptionsRefused(t *testing.T) {
	p := storiesPath(t)
	for _, tc := range []struct {
		backend, units, says string
	}{
		{"neon", "neon{foo=bar}", `unit neon:0{foo=bar}: open context: neon context_create: XPU_E_INVALID_ARG: context_create: unknown option "foo" (this backend takes: cpus, int8dot, repack, threads)`},
		{"neon", "neon{thread=2}", `unknown option "thread"`},
		{"opencl", "opencl{kernel=gpu}", `unknown option "kernel" (this backend takes: kernels, threads)`},
		{"qnn", "qnn{x=1}", `unknown option "x" (this backend takes: perf, hvx_threads, threads)`},
	} {
		t.Run(tc.units, func(t *testing.T) {
			requirePlugins(t, tc.backend)
			code, _, errOut := runCLI(t, "run", "--model", p, "-n", "2", "--units", tc.units)
			assert.Equal(t, 1, code, errOut)
			assert.Contains(t, errOut, tc.says)
		})
	}
	requirePlugins(t, "neon", "opencl")
	code, _, errOut := runCLI(t, "run", "--model", p, "-n", "2", "--units", "neon,opencl{kernels=cpu}", "--threads", "1")
	assert.Equal(t, 0, code, errOut)
}
