package sched

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched/hostsync"
)

// openPinnedOpenCL opens the opencl plugin from a thread restricted to cpu, so that PoCL's
// worker threads (started when the platform is enumerated, one per CPU of the mask) run on
// that core only.
func openPinnedOpenCL(tb testing.TB, cpu int) core.Backend {
	tb.Helper()
	var b core.Backend
	err := hostsync.WithThreadAffinity([]int{cpu}, func() error {
		var err error
		b, err = loader.Open(context.Background(), "opencl")
		return err
	})
	if err != nil {
		tb.Skipf("opencl pinned to cpu %d: %v", cpu, err)
	}
	tb.Cleanup(func() { b.Close() })
	return b
}

// BenchmarkSplitMatMul measures issue 15's MATMUL partitioning ratios in one run, rounds
// interleaved, medians over rounds (-benchtime=Nx sets the rounds): a 256×4096 by 4096×4096ᵀ
// F32 MATMUL (XPU_BENCH_MATMUL=MxKxN to change it, XPU_BENCH_DTYPE=q4_0 the weight's dtype) on
//
//   - neon{cpus=0,threads=1} alone, neon{cpus=1,threads=1} alone, opencl alone (PoCL's CPU
//     device, pinned to core 1: opened from a thread whose mask is {1});
//   - row-split across neon on core 0 and opencl on core 1;
//   - row-split across the two pinned neon units;
//   - both splits again with stealing (NodeSplit.Steal: the units take the weight rows chunk
//     by chunk from either end, and a CONCAT merges the chunks' column bands);
//   - the ceiling: each pair's units running the whole MATMUL at the same time, unsplit, in
//     runtimes of their own ("at_once": what the two cores give together on this machine,
//     against which a split's ratio is measured as well as against the units alone).
//
// The split ratios are each pair's measured throughput shares from a calibration pass (medians
// of 7; what a solver given these units' profiles picks for one MATMUL: with 3, the two
// identical neon units' shares came out 0.44–0.53, and a share 0.04 off costs a split ~8%). A row split of M > 1 rows ends
// with one CONCAT merge on the first unit, which the figures include.
//
// go test ./sched -run '^$' -bench SplitMatMul -benchtime 5x
//
// XPU_BENCH_TRACE=file writes the runs' trace; XPU_BENCH_THREADS_DEBUG=1 logs every thread of
// the process with its CPU mask and CPU time (PoCL's workers show mask 1).
func BenchmarkSplitMatMul(b *testing.B) {
	m, k, n := int64(256), int64(4096), int64(4096)
	if s := os.Getenv("XPU_BENCH_MATMUL"); s != "" {
		if _, err := fmt.Sscanf(s, "%dx%dx%d", &m, &k, &n); err != nil {
			b.Fatalf("XPU_BENCH_MATMUL=%q: want MxKxN", s)
		}
	}
	ctx := context.Background()
	nb, err := loader.Open(ctx, "neon")
	if err != nil {
		b.Skipf("neon: %v", err)
	}
	defer nb.Close()
	ob := openPinnedOpenCL(b, 1)
	devs := append(nb.Devices(), ob.Devices()[0])
	specs := []UnitSpec{{Backend: "neon", Options: map[string]string{"cpus": "0", "threads": "1"}},
		{Backend: "neon", Options: map[string]string{"cpus": "1", "threads": "1"}},
		{Backend: ob.Devices()[0].Info().Backend}}
	var opts []RuntimeOption
	tracePath := os.Getenv("XPU_BENCH_TRACE")
	var tr *Trace
	if tracePath != "" {
		tr = NewTrace()
		opts = append(opts, WithRuntimeTrace(tr))
	}
	rt, err := NewRuntime(ctx, devs, specs, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	ws := make([]float32, n*k)
	for i := range ws {
		ws[i] = rng.Float32() - 0.5
	}
	dt := core.F32
	if s := os.Getenv("XPU_BENCH_DTYPE"); s != "" {
		if dt, err = core.ParseDType(s); err != nil {
			b.Fatal(err)
		}
	}
	wb, err := core.Quantize(dt, ws, 0)
	if err != nil {
		b.Fatal(err)
	}
	g := core.NewGraph()
	x := g.Input("x", core.F32, m, k)
	g.Output(g.Named("mm").MatMul(x, g.Const("w", dt, core.Shape{n, k}, wb)))
	if err := g.Err(); err != nil {
		b.Fatal(err)
	}
	// io allocates the MATMUL's input and output in an arena
	io := func(a *Arena) (x, y Span) {
		var err error
		if x, err = a.Alloc(m * k * 4); err == nil {
			y, err = a.Alloc(m * n * 4)
		}
		if err != nil {
			b.Fatal(err)
		}
		return x, y
	}
	a := rt.Arena()
	xs, ys := io(a)
	for i := range m * k {
		copy(a.Bytes(xs)[4*i:], core.EncodeF32([]float32{rng.Float32() - 0.5}))
	}
	compile := func(unit int, sp *NodeSplit) *Program {
		st := StageSpec{Name: "mm", Graph: g, Units: []int{unit}, IO: []Binding{{Span: xs}, {Span: ys}}}
		if sp != nil {
			st.Splits = []*NodeSplit{sp}
		}
		p, err := rt.Compile(ctx, ProgramSpec{Name: "mm", Phase: PhasePrefill, Stages: []StageSpec{st}})
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	run := func(p *Program) time.Duration {
		t0 := time.Now()
		if err := p.Run(ctx, []Chunk{{}}); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	alone := []*Program{compile(0, nil), compile(1, nil), compile(2, nil)}
	// calibration: each unit's time alone, the median of 7 interleaved runs after one that
	// uploads (one sample is at the mercy of whatever else the core runs)
	var cal [3]time.Duration
	samples := make([][]time.Duration, len(alone))
	for _, p := range alone {
		run(p)
	}
	for range 7 {
		for i, p := range alone {
			samples[i] = append(samples[i], run(p))
		}
	}
	for i, ts := range samples {
		slices.Sort(ts)
		cal[i] = ts[len(ts)/2]
	}
	share := func(u, v int) []float64 {
		r := float64(cal[v]) / float64(cal[u]+cal[v]) // u's share of the rows: v's time share
		return []float64{r, 1 - r}
	}
	splitNO := compile(0, &NodeSplit{Strategy: SplitRows, Units: []int{0, 2}, Ratio: share(0, 2), Merge: 0})
	splitNN := compile(0, &NodeSplit{Strategy: SplitRows, Units: []int{0, 1}, Ratio: share(0, 1), Merge: 0})
	// the ceiling: the two units of a pair each running the whole MATMUL at the same time,
	// in runtimes of their own (a runtime runs one request at a time)
	solo := make([]*Program, len(specs))
	for i, sp := range specs {
		srt, err := NewRuntime(ctx, devs, []UnitSpec{sp})
		if err != nil {
			b.Fatal(err)
		}
		defer srt.Close()
		sa := srt.Arena()
		sx, sy := io(sa)
		copy(sa.Bytes(sx), a.Bytes(xs)[:m*k*4])
		if solo[i], err = srt.Compile(ctx, ProgramSpec{Name: "mm", Phase: PhasePrefill, Stages: []StageSpec{{Name: "mm", Graph: g,
			Units: []int{0}, IO: []Binding{{Span: sx}, {Span: sy}}}}}); err != nil {
			b.Fatal(err)
		}
		run(solo[i])
	}
	// atOnce runs solo[u] and solo[v] from one start and returns each one's time
	atOnce := func(u, v int) [2]time.Duration {
		var d [2]time.Duration
		start := make(chan struct{})
		var wg sync.WaitGroup
		for j, i := range []int{u, v} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				d[j] = run(solo[i])
			}()
		}
		close(start)
		wg.Wait()
		return d
	}
	stealNO := compile(0, &NodeSplit{Strategy: SplitRows, Units: []int{0, 2}, Ratio: share(0, 2), Merge: 0, Steal: true})
	stealNN := compile(0, &NodeSplit{Strategy: SplitRows, Units: []int{0, 1}, Ratio: share(0, 1), Merge: 0, Steal: true})
	progs := append(alone, splitNO, splitNN, stealNO, stealNN)
	times := make([][]time.Duration, len(progs)+4) // then neon0, neon1 at once; neon0, opencl at once
	b.ResetTimer()
	for range b.N {
		for i, p := range progs {
			times[i] = append(times[i], run(p))
		}
		for j, pair := range [][2]int{{0, 1}, {0, 2}} {
			d := atOnce(pair[0], pair[1])
			times[len(progs)+2*j] = append(times[len(progs)+2*j], d[0])
			times[len(progs)+2*j+1] = append(times[len(progs)+2*j+1], d[1])
		}
	}
	b.StopTimer()
	tput := make([]float64, len(times)) // MATMULs per second, from the median
	for i, ts := range times {
		s := slices.Clone(ts)
		slices.Sort(s)
		tput[i] = 1e9 / float64(s[len(s)/2])
	}
	// what the pair does at once: each unit's throughput while the other runs too (opencl's
	// run outlasts neon's, so neon's is fully contended and opencl's partly: a ceiling
	// slightly above the true one)
	ceilNN, ceilNO := tput[len(progs)]+tput[len(progs)+1], tput[len(progs)+2]+tput[len(progs)+3]
	gflops := float64(2*m*k*n) / 1e9
	b.ReportMetric(gflops*tput[0], "neon0_GFLOPS")
	b.ReportMetric(gflops*tput[1], "neon1_GFLOPS")
	b.ReportMetric(gflops*tput[2], "opencl1_GFLOPS")
	b.ReportMetric(gflops*tput[3], "split_neon0+opencl1_GFLOPS")
	b.ReportMetric(gflops*tput[4], "split_neon0+neon1_GFLOPS")
	b.ReportMetric(tput[3]/(tput[0]+tput[2]), "split_neon+opencl/sum")
	b.ReportMetric(tput[4]/tput[0], "split_2neon/neon0")
	b.ReportMetric(tput[4]/(tput[0]+tput[1]), "split_2neon/sum")
	b.ReportMetric(ceilNN/tput[0], "at_once_2neon/neon0")
	b.ReportMetric(ceilNO/(tput[0]+tput[2]), "at_once_neon+opencl/sum")
	b.ReportMetric(tput[4]/ceilNN, "split_2neon/at_once")
	b.ReportMetric(tput[3]/ceilNO, "split_neon+opencl/at_once")
	b.ReportMetric(tput[5]/(tput[0]+tput[2]), "steal_neon+opencl/sum")
	b.ReportMetric(tput[6]/tput[0], "steal_2neon/neon0")
	b.ReportMetric(share(0, 2)[0], "ratio_neon_vs_opencl")
	b.ReportMetric(share(0, 1)[0], "ratio_neon0_vs_neon1")
	if os.Getenv("XPU_BENCH_THREADS_DEBUG") != "" {
		ds, _ := filepath.Glob("/proc/self/task/*")
		for _, d := range ds {
			st, _ := os.ReadFile(d + "/status")
			stat, _ := os.ReadFile(d + "/stat")
			f := strings.Fields(string(stat))
			for _, l := range strings.Split(string(st), "\n") {
				if strings.HasPrefix(l, "Cpus_allowed_list") && len(f) > 15 {
					b.Logf("thread %s %s utime %s stime %s", filepath.Base(d), l, f[13], f[14])
				}
			}
		}
	}
	if tr != nil {
		if err := tr.WriteFile(tracePath); err != nil {
			b.Fatal(err)
		}
	}
}
