package llm

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// pinnedThreads counts this process's threads whose CPU affinity is exactly cpus (as
// /proc/self/task/*/status lists it): the neon plugin runs in-process and pins its workers.
func pinnedThreads(t *testing.T, cpus string) int {
	t.Helper()
	dirs, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skipf("no /proc/self/task: %v", err)
	}
	n := 0
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", d.Name(), "status"))
		if err != nil {
			continue // the thread exited
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok && strings.TrimSpace(v) == cpus {
				n++
			}
		}
	}
	return n
}

func neonDevice(t *testing.T) core.Device {
	t.Helper()
	if runtime.NumCPU() < 2 {
		t.Skipf("per-phase pinning needs two CPUs, this process may use %d", runtime.NumCPU())
	}
	return pluginDevices(t, "neon")[0]
}

// TestPhaseOptionsSwitchCores: prefill runs on CPU 0 and decode on CPU 1 of one neon context
// (the workers' affinity shows which executable ran last), and the greedy stories260K text is
// the published one, with prefill and decode on different CPU sets.
func TestPhaseOptionsSwitchCores(t *testing.T) {
	m := openStories(t)
	dev := neonDevice(t)
	want, err := os.ReadFile(filepath.Join(modelsDir(t), "stories260K.greedy.txt"))
	require.NoError(t, err)
	ctx := context.Background()

	t.Run("pinning follows the phase", func(t *testing.T) {
		r, err := NewRunner(ctx, m, dev, WithContextOptions(map[string]string{"threads": "1"}),
			WithPhaseOptions(map[string]string{"cpus": "0", "threads": "1"}, map[string]string{"cpus": "1", "threads": "1"}))
		require.NoError(t, err)
		defer r.Close()
		_, err = r.Prefill(ctx, []int32{1, 403, 407, 261})
		require.NoError(t, err)
		require.Equal(t, 1, pinnedThreads(t, "0"), "after prefill: the worker on CPU 0")
		require.Zero(t, pinnedThreads(t, "1"))
		_, err = r.Decode(ctx, 500)
		require.NoError(t, err)
		require.Equal(t, 1, pinnedThreads(t, "1"), "after decode: the same worker, now on CPU 1")
		require.Zero(t, pinnedThreads(t, "0"))
		_, err = r.Prefill(ctx, []int32{300, 301, 302})
		require.NoError(t, err)
		require.Equal(t, 1, pinnedThreads(t, "0"), "back to prefill's CPU")
	})

	for name, tc := range map[string]struct{ ctx, prefill, decode map[string]string }{
		"prefill on both, decode on cpu 1": {map[string]string{"threads": "2"},
			map[string]string{"cpus": "0,1", "threads": "2"}, map[string]string{"cpus": "1", "threads": "1"}},
		"prefill on cpu 1, decode on cpu 0": {map[string]string{"threads": "1"},
			map[string]string{"cpus": "1"}, map[string]string{"cpus": "0"}},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := NewRunner(ctx, m, dev, WithContextOptions(tc.ctx), WithChunkSize(4),
				WithPhaseOptions(tc.prefill, tc.decode))
			require.NoError(t, err)
			defer r.Close()
			res, err := r.Generate(ctx, "", WithMaxTokens(256))
			require.NoError(t, err)
			require.Equal(t, strings.TrimSuffix(string(want), "\n"), res.Text)
		})
	}
}

// TestPhaseOptionsBadCPUs: a CPU set naming a CPU that is not online, or one that is not a
// list, fails NewRunner with the plugin's reason.
func TestPhaseOptionsBadCPUs(t *testing.T) {
	m := openStories(t)
	dev := neonDevice(t)
	for name, tc := range map[string]struct {
		prefill, decode map[string]string
		want            string
	}{
		"absent cpu in decode":  {nil, map[string]string{"cpus": "63"}, "CPU 63, which is not online"},
		"absent cpu in prefill": {map[string]string{"cpus": "0,1000"}, nil, "CPU 1000, which is not online"},
		"garbage":               {map[string]string{"cpus": "fast"}, nil, "bad cpus option"},
		"bad threads":           {nil, map[string]string{"threads": "0"}, "bad threads option"},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := NewRunner(context.Background(), m, dev, WithPhaseOptions(tc.prefill, tc.decode))
			if r != nil {
				r.Close()
			}
			require.ErrorIs(t, err, core.ErrInvalidArgument)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
