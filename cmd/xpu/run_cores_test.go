package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/sched/coresel"
	"github.com/xpuhub/xpu/sched/cputopo"
)

// storeSelection saves, with the aecs package's own API, a measured tuning result for neon on
// this machine that decodes on one core and prefills on all: what `xpu tune --energy` leaves.
func storeSelection(t *testing.T) string {
	t.Helper()
	top, err := cputopo.Read()
	if err != nil {
		t.Skipf("no CPU topology here: %v", err)
	}
	if top.Counts().Cores() < 2 {
		t.Skipf("one CPU: no selection differs from all cores")
	}
	one := make(cputopo.Selection, len(top.Clusters))
	one[0] = 1
	rec, err := coresel.NewRecord(top, &coresel.Result{Prefill: top.Counts(), Decode: one},
		coresel.MeasuredFingerprint(top, "neon"), "measured", "test", "stories260K", 50)
	require.NoError(t, err)
	dir, err := coresel.CacheDir()
	require.NoError(t, err)
	path, err := coresel.Save(dir, rec)
	require.NoError(t, err)
	return path
}

// TestRunPhaseCores: xpu run on neon takes the selection stored by xpu tune --energy and says
// so; an explicit --cpus-* flag wins; --no-aecs turns the cache off; the text
// is the greedy one whichever cores run it.
func TestRunPhaseCores(t *testing.T) {
	p := storiesPath(t)
	requirePlugins(t, "neon")
	want, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stories260K.greedy.txt"))
	require.NoError(t, err)
	t.Setenv("XPU_CACHE_DIR", t.TempDir())
	base := []string{"run", "--model", p, "--temp", "0", "-n", "24", "--backend", "neon"}

	code, out, errOut := runCLI(t, base...)
	require.Equal(t, 0, code, errOut)
	assert.NotContains(t, errOut, "cores:", "nothing stored, nothing said")

	path := storeSelection(t)
	top, err := cputopo.Read()
	require.NoError(t, err)
	all, err := top.Counts().CPUs(top)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		args []string
		line string // "" : no cores line
	}{
		{"stored", nil, "cores: prefill cpus=" + cputopo.FormatCPUList(all) + ", decode cpus=0 (stored by xpu tune --energy in " + path},
		{"flag wins", []string{"--cpus-decode", "1"}, "cores: prefill the backend's default, decode cpus=1 (--cpus-prefill/--cpus-decode)"},
		{"both flags", []string{"--cpus-prefill", "0-1", "--cpus-decode", "0"}, "cores: prefill cpus=0,1, decode cpus=0 (--cpus-prefill/--cpus-decode)"},
		{"--no-aecs", []string{"--no-aecs"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut = runCLI(t, append(append([]string{}, base...), tc.args...)...)
			require.Equal(t, 0, code, errOut)
			assert.True(t, strings.HasPrefix(string(want), strings.TrimSuffix(out, "\n")), out)
			if tc.line == "" {
				assert.NotContains(t, errOut, "cores:")
			} else {
				assert.Contains(t, errOut, tc.line)
				assert.Equal(t, 1, strings.Count(errOut, "cores:"), errOut)
			}
		})
	}
}

func TestRunPhaseCoresErrors(t *testing.T) {
	p := storiesPath(t)
	requirePlugins(t, "neon")
	t.Setenv("XPU_CACHE_DIR", t.TempDir())
	runCLICases(t, []string{"run", "--model", p, "-n", "2", "--backend", "neon"}, []cliCase{
		{"garbage", []string{"--cpus-decode", "big"}, 2, `--cpus-decode: cputopo: bad core selection: CPU list "big"`},
		{"empty range", []string{"--cpus-prefill", "3-1"}, 2, "bad range"},
		{"absent cpu", []string{"--cpus-decode", "63"}, 1, "CPU 63, which is not online"},
	})
}
