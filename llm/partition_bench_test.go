package llm

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched"
	"github.com/xpuhub/xpu/sched/hostsync"
)

// BenchmarkTensorPartition measures issue 15's model-level partitioning ratios in one run,
// rounds interleaved, medians over rounds (-benchtime=Nx sets the rounds):
//
//   - prefill (256 tokens in 64-token chunks; XPU_BENCH_PROMPT and XPU_BENCH_CHUNK change them) with every MATMUL split across
//     neon{cpus=0,threads=1} and opencl (PoCL's CPU device pinned to core 1) and the rest on
//     neon, against each of the two units alone; the split is rows (XPU_BENCH_SPLIT=seq: the
//     prompt rows instead) with the units' measured prefill throughput shares as the ratio (a
//     calibration pass, medians of 3: the plan a solver would make from these two profiles; hand-written
//     here, h/solver's `xpu plan` did not exist yet);
//   - decode with every MATMUL row-split over neon{cpus=0,threads=1} and
//     neon{cpus=1,threads=1} (ratio from their measured decode speeds; a decode row is one
//     token, so each part writes its slice of the output in place) against one such unit and
//     against one neon unit with two threads.
//
// XPU_BENCH_MODEL=/tmp/ck/1b-q4_0.gguf go test ./llm -run '^$' -bench TensorPartition -benchtime 3x
//
// XPU_BENCH_TRACE=file writes the split runs' trace. XPU_BENCH_PREFILL_PLAN=plan.json runs the
// prefill by that plan (e.g. the solver's `xpu plan` over neon{cpus=0,threads=1} and opencl)
// instead of the calibrated hand-written one; its chunk setting, if any, then applies.
func BenchmarkTensorPartition(b *testing.B) {
	m := benchModel(b)
	ctx := context.Background()
	chunk, promptLen := envInt(b, "XPU_BENCH_CHUNK", 64), envInt(b, "XPU_BENCH_PROMPT", 256)
	const decodeSteps = 16
	strategy := "rows"
	if s := os.Getenv("XPU_BENCH_SPLIT"); s != "" {
		strategy = s
	}
	nb, err := loader.Open(ctx, "neon")
	if err != nil {
		b.Skipf("neon: %v", err)
	}
	b.Cleanup(func() { nb.Close() })
	var ob core.Backend
	if err := hostsync.WithThreadAffinity([]int{1}, func() error {
		var err error
		ob, err = loader.Open(ctx, "opencl")
		return err
	}); err != nil {
		b.Skipf("opencl pinned to core 1: %v", err)
	}
	b.Cleanup(func() { ob.Close() })
	devs := append(nb.Devices(), ob.Devices()...)
	ocl := ob.Devices()[0].Info().Backend
	var tr *sched.Trace
	if os.Getenv("XPU_BENCH_TRACE") != "" {
		tr = sched.NewTrace()
	}
	mk := func(js string, traced bool) *Runner {
		plan, err := sched.ParsePlan([]byte(js))
		if err != nil {
			b.Fatal(err)
		}
		opts := []RunnerOption{WithChunkSize(chunk), WithContextLength(promptLen + decodeSteps + 1)}
		if traced && tr != nil {
			opts = append(opts, WithTrace(tr))
		}
		r, err := NewPlannedRunner(ctx, m, devs, plan, opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { r.Close() })
		return r
	}
	single := func(unit string) string {
		return fmt.Sprintf(`{"units":[%q],"prefill":{"rules":[{"unit":"0"}]}}`, unit)
	}
	const n0, n1 = "neon{cpus=0,threads=1}", "neon{cpus=1,threads=1}"
	prompt := make([]int32, promptLen)
	for i := range prompt {
		prompt[i] = int32(3 + i%200)
	}
	prefill := func(r *Runner) time.Duration {
		r.Reset()
		t0 := time.Now()
		if _, err := r.Prefill(ctx, prompt); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	decode := func(r *Runner) time.Duration {
		r.Reset()
		if _, err := r.Prefill(ctx, prompt[:8]); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		for i := range decodeSteps {
			if _, err := r.Decode(ctx, int32(5+i)); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(t0) / decodeSteps
	}
	neon0, neon1, opencl, threads := mk(single(n0), false), mk(single(n1), false), mk(single(ocl), false),
		mk(single("neon{threads=2}"), false)
	// calibration: the median of 3 interleaved runs after one that uploads and warms up (one
	// sample is at the mercy of whatever else the core runs)
	type cal struct {
		f  func(*Runner) time.Duration
		r  *Runner
		ts []time.Duration
	}
	cals := []*cal{{f: prefill, r: neon0}, {f: prefill, r: opencl}, {f: decode, r: neon0}, {f: decode, r: neon1}}
	for _, c := range cals {
		c.f(c.r)
	}
	for range 3 {
		for _, c := range cals {
			c.ts = append(c.ts, c.f(c.r))
		}
	}
	for _, c := range cals {
		slices.Sort(c.ts)
	}
	pN, pO, dN0, dN1 := cals[0].ts[1], cals[1].ts[1], cals[2].ts[1], cals[3].ts[1]
	pRatio := float64(pO) / float64(pN+pO) // neon's share: opencl's time share
	dRatio := float64(dN1) / float64(dN0+dN1)
	prefillPlan := fmt.Sprintf(`{"units":[%q,%q],"prefill":{"rules":[
		{"ops":["MATMUL"],"split":{"strategy":%q,"units":["0","1"],"ratio":[%g,%g]}},{"unit":"0"}]},
		"decode":{"rules":[{"unit":"0"}]}}`, n0, ocl, strategy, pRatio, 1-pRatio)
	if f := os.Getenv("XPU_BENCH_PREFILL_PLAN"); f != "" {
		// a given plan (the solver's `xpu plan -o FILE` over the same units) instead
		js, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		prefillPlan = string(js)
	}
	prefillSplit := mk(prefillPlan, true)
	decodeSplit := mk(fmt.Sprintf(`{"units":[%q,%q],"prefill":{"rules":[
		{"ops":["MATMUL"],"split":{"strategy":"rows","units":["0","1"],"ratio":[%g,%g]}},{"unit":"0"}]}}`,
		n0, n1, dRatio, 1-dRatio), true)
	type series struct {
		name string
		f    func(*Runner) time.Duration
		r    *Runner
		ts   []time.Duration
	}
	all := []*series{
		{name: "prefill neon0", f: prefill, r: neon0}, {name: "prefill opencl1", f: prefill, r: opencl},
		{name: "prefill split", f: prefill, r: prefillSplit},
		{name: "decode neon0", f: decode, r: neon0}, {name: "decode neon1", f: decode, r: neon1},
		{name: "decode 2 threads", f: decode, r: threads}, {name: "decode split", f: decode, r: decodeSplit},
	}
	for _, s := range all[2:] {
		if s.r == prefillSplit || s.r == decodeSplit {
			s.f(s.r) // warm-up, as the calibration was for the others
		}
	}
	b.ResetTimer()
	for range b.N {
		for _, s := range all {
			s.ts = append(s.ts, s.f(s.r))
		}
	}
	b.StopTimer()
	med := make([]float64, len(all))
	for i, s := range all {
		x := slices.Clone(s.ts)
		slices.Sort(x)
		med[i] = float64(x[len(x)/2])
	}
	tps := func(d float64) float64 { return float64(promptLen) / (d / 1e9) }
	b.ReportMetric(tps(med[0]), "prefill_neon0_tok/s")
	b.ReportMetric(tps(med[1]), "prefill_opencl1_tok/s")
	b.ReportMetric(tps(med[2]), "prefill_split_tok/s")
	b.ReportMetric(min(med[0], med[1])/med[2], "prefill_split/faster")
	b.ReportMetric((tps(med[2]))/(tps(med[0])+tps(med[1])), "prefill_split/sum")
	b.ReportMetric(pRatio, "prefill_ratio_neon")
	b.ReportMetric(1e9/med[3], "decode_neon0_tok/s")
	b.ReportMetric(1e9/med[4], "decode_neon1_tok/s")
	b.ReportMetric(1e9/med[5], "decode_2threads_tok/s")
	b.ReportMetric(1e9/med[6], "decode_split_tok/s")
	b.ReportMetric(med[3]/med[6], "decode_split/neon0")
	b.ReportMetric(med[5]/med[6], "decode_split/2threads")
	b.ReportMetric(dRatio, "decode_ratio_neon0")
	for _, r := range []*Runner{prefillSplit, decodeSplit} {
		rep := r.Report()
		var ph []string
		for _, p := range rep.Phases {
			ph = append(ph, p.String())
		}
		b.Logf("%s:\n%s\n  %s", r.Units(), rep, strings.Join(ph, "\n  "))
	}
	if tr != nil {
		if err := tr.WriteFile(os.Getenv("XPU_BENCH_TRACE")); err != nil {
			b.Fatal(err)
		}
	}
}

// envInt reads a positive integer from the environment, or gives def.
func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	var v int
	if _, err := fmt.Sscan(s, &v); err != nil || v < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return v
}
