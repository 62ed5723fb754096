package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/w8a8"
	"github.com/xpuhub/xpu/sched/coresel"
	"github.com/xpuhub/xpu/sched/cputopo"
)

// runCLIWithin is runCLI with a deadline: a command blocked for good (opening a FIFO no one
// writes) fails the test instead of hanging it. The blocked goroutine is left behind.
func runCLIWithin(t *testing.T, d time.Duration, args ...string) (int, string, string) {
	t.Helper()
	type result struct {
		code        int
		out, errOut string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errOut := runCLI(t, args...)
		done <- result{code, out, errOut}
	}()
	select {
	case r := <-done:
		return r.code, r.out, r.errOut
	case <-time.After(d):
		t.Fatalf("xpu %v still running after %v (blocked on a FIFO?)", args, d)
		return 0, "", ""
	}
}

// mkfifo makes a FIFO at path (and its folder).
func mkfifo(t *testing.T, path string) string {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, unix.Mkfifo(path, 0o644))
	return path
}

// A FIFO wherever a command reads a file, named on the command line or found in the cache, is
// refused at once with a clear error (or, for a cache that can only save time, ignored): never
// waited on.
func TestFIFOsRefused(t *testing.T) {
	model := storiesPath(t)
	for _, tc := range []struct {
		name string
		// setup makes the FIFO (cache is $XPU_CACHE_DIR) and returns the command line
		setup func(t *testing.T, dir, cache string) []string
		code  int    // 0: the command succeeds, the FIFO ignored
		says  string // on stderr
	}{
		{"model", func(t *testing.T, dir, _ string) []string {
			return []string{"run", "--model", mkfifo(t, filepath.Join(dir, "m.gguf")), "-n", "1", "--backend", "ref"}
		}, 1, "a named pipe (FIFO), not a regular file"},
		{"--plan", func(t *testing.T, dir, _ string) []string {
			return []string{"run", "--model", model, "--plan", mkfifo(t, filepath.Join(dir, "plan.json")), "-n", "1"}
		}, 1, "not a regular file"},
		{"--calib", func(t *testing.T, dir, _ string) []string {
			return []string{"run", "--model", model, "--w8a8", "--calib", mkfifo(t, filepath.Join(dir, "c.json")), "-n", "1", "--backend", "ref"}
		}, 1, "not a regular file"},
		{"--sidecar", func(t *testing.T, dir, _ string) []string {
			return []string{"run", "--model", model, "--sparse", "on", "--sidecar", mkfifo(t, filepath.Join(dir, "s.gguf")), "-n", "1", "--backend", "ref"}
		}, 1, "not a regular file"},
		{"--profile", func(t *testing.T, dir, _ string) []string {
			return []string{"plan", "--model", model, "--profile", mkfifo(t, filepath.Join(dir, "p.json"))}
		}, 1, "not a regular file"},
		{"w8a8/ in the cache", func(t *testing.T, _, _ string) []string {
			f, err := gguf.Open(model)
			require.NoError(t, err)
			defer f.Close()
			p, err := w8a8.CachePath(w8a8.ModelKey(f))
			require.NoError(t, err)
			mkfifo(t, p)
			return []string{"run", "--model", model, "--w8a8", "-n", "1", "--backend", "ref"}
		}, 1, "not a regular file"},
		{"profiles/ in the cache", func(t *testing.T, _, _ string) []string {
			args := []string{"plan", "--model", model, "--units", "ref"}
			code, _, errOut := runCLIWithin(t, time.Minute, args...)
			require.Equal(t, 1, code, errOut)
			m := regexp.MustCompile(`under key (\S+) in (\S+) `).FindStringSubmatch(errOut)
			require.NotNil(t, m, errOut)
			mkfifo(t, filepath.Join(m[2], m[1]+".json"))
			return args
		}, 1, "not a regular file"},
		{"aecs/ in the cache", func(t *testing.T, _, _ string) []string {
			requirePlugins(t, "neon")
			top, err := cputopo.Read()
			require.NoError(t, err)
			d, err := coresel.CacheDir()
			require.NoError(t, err)
			mkfifo(t, filepath.Join(d, coresel.MeasuredFingerprint(top, "neon")+".json"))
			return []string{"run", "--model", model, "-n", "1", "--backend", "neon"}
		}, 0, "not a regular file"},
		{"probe/ in the cache", func(t *testing.T, _, cache string) []string {
			code, _, errOut := runCLIWithin(t, time.Minute, "devices")
			require.Equal(t, 0, code, errOut)
			entries, err := filepath.Glob(filepath.Join(cache, "probe", "*.json"))
			require.NoError(t, err)
			require.NotEmpty(t, entries, "devices stored no probe answer")
			for _, e := range entries {
				require.NoError(t, os.Remove(e))
				mkfifo(t, e)
			}
			return []string{"devices"}
		}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cache := filepath.Join(dir, "cache")
			t.Setenv("XPU_CACHE_DIR", cache)
			args := tc.setup(t, dir, cache)
			code, _, errOut := runCLIWithin(t, time.Minute, args...)
			assert.Equal(t, tc.code, code, errOut)
			assert.Contains(t, errOut, tc.says)
		})
	}
}
