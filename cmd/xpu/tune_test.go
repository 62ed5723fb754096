package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTuneSimulated(t *testing.T) {
	tests := []struct {
		soc, decode, paper string
	}{
		{"kirin9000", "decode:  2×Cortex-A77@2.54GHz", "paper, Table 7: 2×A77 at 2.54 GHz"},
		{"sd8gen3", "decode:  1×Cortex-X4@3.30GHz + 1×Cortex-A720@2.96GHz", "1×X4 at 3.3 GHz + 1×A720 at 2.96 GHz"},
	}
	for _, tt := range tests {
		t.Run(tt.soc, func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv("XPU_CACHE_DIR", dir)
			code, out, errOut := runCLI(t, "tune", "--energy", "--simulate", tt.soc, "--seed", "3")
			require.Equal(t, 0, code, errOut)
			assert.Contains(t, out, "SIMULATION of")
			assert.Contains(t, out, "PREDICTED decode")
			assert.Contains(t, out, "model:soc "+tt.soc+" (simulated)")
			assert.Contains(t, out, tt.decode)
			assert.Contains(t, out, tt.paper)
			assert.NotContains(t, out, "MEASURED")
			files, err := filepath.Glob(filepath.Join(dir, "aecs", "*.json"))
			require.NoError(t, err)
			assert.Len(t, files, 1)
			assert.Contains(t, errOut, "stored: ")
		})
	}
}

func TestTuneMeasuredOnThisMachine(t *testing.T) {
	model := filepath.Join("..", "..", "..", "shared", "models", "stories260K.gguf")
	if _, err := os.Stat(model); err != nil {
		t.Skipf("test model absent: %v", err)
	}
	requirePlugins(t, "neon")
	t.Setenv("XPU_CACHE_DIR", t.TempDir())
	code, out, errOut := runCLI(t, "tune", "--energy", "--model", model, "--tokens", "100", "--warmup", "2",
		"--compare", "1", "--root", "../../sched/cputopo/testdata/vm2")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "no energy meter here")
	assert.Contains(t, out, "MODELLED")
	assert.Contains(t, out, "no cpufreq")
	assert.Contains(t, out, "exhaustive space 2 selections")
	assert.Contains(t, out, "CPU-s/token")
	assert.Contains(t, out, "MEASURED chosen/all-cores")
	assert.Regexp(t, `decode: +[12]×Intel`, out)
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestTuneErrors(t *testing.T) {
	hot := t.TempDir()
	for _, rel := range []string{"sys/devices/system/cpu/online", "sys/class/thermal/thermal_zone0/temp"} {
		require.NoError(t, os.MkdirAll(filepath.Join(hot, filepath.Dir(rel)), 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(hot, "sys/devices/system/cpu/online"), []byte("0\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(hot, "sys/class/thermal/thermal_zone0/temp"), []byte("55000\n"), 0o644))
	runCLICases(t, nil, []cliCase{
		{args: []string{"tune", "--simulate", "kirin9000"}, code: 2, says: "usage"},
		{args: []string{"tune", "--energy"}, code: 2, says: "usage"},
		{args: []string{"tune", "--energy", "--simulate", "kirin9000", "--tokens", "0"}, code: 2, says: "usage"},
		{args: []string{"tune", "--energy", "--simulate", "nope"}, code: 1, says: "unknown SoC description"},
		{args: []string{"tune", "--energy", "--simulate", "kirin9000", "--epsilon", "1.5", "--no-cache"}, code: 1, says: "ε"},
		{args: []string{"tune", "--energy", "--model", "x.gguf", "--root", t.TempDir()}, code: 1, says: "topology unreadable"},
		{args: []string{"tune", "--energy", "--model", "x.gguf", "--root", hot, "--cool-wait", "0s"}, code: 1, says: "too hot"},
		{args: []string{"tune", "--energy", "--model", "x.gguf", "--root", "../../sched/cputopo/testdata/vm2", "--soc", "kirin9000"}, code: 1, says: "does not describe this machine"},
		{args: []string{"tune", "--energy", "--model", "x.gguf", "--root", "../../sched/cputopo/testdata/vm2", "--soc", "nope"}, code: 1, says: "unknown SoC"},
	})
}

// xpu tune --profile checks where the profile goes before it measures: an unusable cache or -o
// folder fails at once, with nothing measured and lost.
func TestTuneProfileUnwritableFailsFirst(t *testing.T) {
	model := storiesPath(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	for _, tc := range []struct {
		name  string
		cache string
		args  []string
		says  string
	}{
		{"cache under a file", filepath.Join(file, "cache"), nil, "the profile cache folder " + filepath.Join(file, "cache", "profiles") + " cannot be created"},
		{"-o under a file", dir, []string{"-o", filepath.Join(file, "p.json")}, "-o " + filepath.Join(file, "p.json") + ": folder " + file + " cannot be created"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("XPU_CACHE_DIR", tc.cache)
			args := append([]string{"tune", "--profile", "--model", model, "--units", "ref", "--grid", "1", "--min-time", "1ms"}, tc.args...)
			code, out, errOut := runCLI(t, args...)
			assert.Equal(t, 1, code, errOut)
			assert.Contains(t, errOut, tc.says)
			assert.NotContains(t, out, "profiling", "nothing was measured")
		})
	}
}
