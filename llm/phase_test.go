package llm

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// liveThreads lists this process's thread ids: threads of earlier tests (a runtime's pinned
// workers end just after its Close returns) are left out of pinnedThreads' count.
func liveThreads(t *testing.T) map[string]bool {
	t.Helper()
	dirs, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skipf("no /proc/self/task: %v", err)
	}
	ids := map[string]bool{}
	for _, d := range dirs {
		ids[d.Name()] = true
	}
	return ids
}

// pinnedThreads counts this process's threads, other than those in before, whose CPU affinity
// is exactly cpus (as /proc/self/task/*/status lists it): the neon plugin runs in-process and
// pins its workers.
func pinnedThreads(t *testing.T, before map[string]bool, cpus string) int {
	t.Helper()
	dirs, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skipf("no /proc/self/task: %v", err)
	}
	n := 0
	for _, d := range dirs {
		if before[d.Name()] {
			continue
		}
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
		before := liveThreads(t)
		r, err := NewRunner(ctx, m, dev, WithContextOptions(map[string]string{"threads": "1"}),
			WithPhaseOptions(map[string]string{"cpus": "0", "threads": "1"}, map[string]string{"cpus": "1", "threads": "1"}))
		require.NoError(t, err)
		defer r.Close()
		_, err = r.Prefill(ctx, []int32{1, 403, 407, 261})
		require.NoError(t, err)
		require.Equal(t, 1, pinnedThreads(t, before, "0"), "after prefill: the worker on CPU 0")
		require.Zero(t, pinnedThreads(t, before, "1"))
		_, err = r.Decode(ctx, 500)
		require.NoError(t, err)
		require.Equal(t, 1, pinnedThreads(t, before, "1"), "after decode: the same worker, now on CPU 1")
		require.Zero(t, pinnedThreads(t, before, "0"))
		_, err = r.Prefill(ctx, []int32{300, 301, 302})
		require.NoError(t, err)
		require.Equal(t, 1, pinnedThreads(t, before, "0"), "back to prefill's CPU")
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

// BenchmarkRunnerPhaseSwitch measures a phase switch inside the runner on stories260K, through
// the runner's trace: one neon context with a pool of one worker, prefill (a 4-token chunk)
// pinned to CPU 0 and decode to CPU 1, so the first region of a decode step after a prefill
// re-pins (moves) the worker. Each round is Reset, P, D, D; the switch is the median duration
// of the decode program's first partition (the embedding: one small region, so little else
// varies) right after a prefill minus its median right after a decode. The control pins both
// phases to CPU 0: the same executables alternate, nothing is re-pinned, so what a change of
// executable costs by itself (caches) shows apart from the move. Whole steps are no measure
// here: a step is ~100 regions, and on a loaded 2-CPU machine their scheduling noise is
// milliseconds.
func BenchmarkRunnerPhaseSwitch(b *testing.B) {
	if runtime.NumCPU() < 2 {
		b.Skipf("per-phase pinning needs two CPUs, this process may use %d", runtime.NumCPU())
	}
	m := openStories(b)
	dev := pluginDevices(b, "neon")[0]
	ctx := context.Background()
	cpu0 := map[string]string{"cpus": "0", "threads": "1"}
	for _, bc := range []struct {
		name   string
		decode map[string]string
	}{{"switching cores", map[string]string{"cpus": "1", "threads": "1"}}, {"same cores", cpu0}} {
		b.Run(bc.name, func(b *testing.B) {
			tr := sched.NewTrace()
			r, err := NewRunner(ctx, m, dev, WithChunkSize(4), WithContextOptions(map[string]string{"threads": "1"}),
				WithPhaseOptions(cpu0, bc.decode), WithTrace(tr))
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			prompt := []int32{1, 403, 407, 261}
			round := func() {
				r.Reset()
				if _, err := r.Prefill(ctx, prompt); err != nil {
					b.Fatal(err)
				}
				for range 2 {
					if _, err := r.Decode(ctx, 500); err != nil {
						b.Fatal(err)
					}
				}
			}
			for range 20 {
				round() // warm-up: pages, pool threads
			}
			for b.Loop() {
				round()
			}
			after, err := embedAfter(tr)
			if err != nil {
				b.Fatal(err)
			}
			// the warm-up's rounds are the first 20 of each kind
			ap, ad := after[sched.PhasePrefill][20:], after[sched.PhaseDecode][20:]
			b.ReportMetric((median(ap)-median(ad))/1e3, "µs/switch")
			b.ReportMetric(median(ap)/1e3, "µs/embed-after-prefill")
			b.ReportMetric(median(ad)/1e3, "µs/embed-after-decode")
		})
	}
}

// embedAfter reads tr's slices in time order and gives the durations (ns) of the decode
// program's embedding partition, by the phase of the embedding run before it.
func embedAfter(tr *sched.Trace) (map[sched.Phase][]float64, error) {
	var buf bytes.Buffer
	if err := tr.WriteJSON(&buf); err != nil {
		return nil, err
	}
	type event struct {
		Ph   string  `json:"ph"`
		Ts   float64 `json:"ts"`
		Dur  float64 `json:"dur"`
		Args struct {
			Program string `json:"program"`
			Stage   string `json:"stage"`
		} `json:"args"`
	}
	var doc struct {
		TraceEvents []event `json:"traceEvents"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		return nil, err
	}
	evs := doc.TraceEvents
	slices.SortStableFunc(evs, func(a, b event) int { return cmp.Compare(a.Ts, b.Ts) })
	out := map[sched.Phase][]float64{}
	var last sched.Phase
	for _, e := range evs {
		if e.Ph != "X" || e.Args.Stage != "embed" {
			continue
		}
		ph := sched.PhasePrefill
		if strings.HasPrefix(e.Args.Program, string(sched.PhaseDecode)) {
			ph = sched.PhaseDecode
		}
		if ph == sched.PhaseDecode && last != "" {
			out[last] = append(out[last], e.Dur*1e3)
		}
		last = ph
	}
	if len(out[sched.PhasePrefill]) <= 20 || len(out[sched.PhaseDecode]) <= 20 {
		return nil, fmt.Errorf("trace: %d and %d decode embeddings after prefill and decode", len(out[sched.PhasePrefill]), len(out[sched.PhaseDecode]))
	}
	return out, nil
}

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}
