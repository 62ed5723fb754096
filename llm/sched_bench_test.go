package llm

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/synth"
	"github.com/xpuhub/xpu/sched"
)

// benchModel opens $XPU_BENCH_MODEL, or writes a synthetic 15M-parameter Q4_0 model.
func benchModel(b *testing.B) *Model {
	path := os.Getenv("XPU_BENCH_MODEL")
	if path == "" {
		path = filepath.Join(b.TempDir(), "bench.gguf")
		spec, err := synth.Preset("llama", "15M", core.Q4_0, 1)
		if err != nil {
			b.Fatal(err)
		}
		if err := synth.WriteFile(path, spec); err != nil {
			b.Fatal(err)
		}
	}
	m, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}

// BenchmarkSchedulerTwoNeonUnits measures issue 11's scheduler ratios in one run, rounds
// interleaved, medians over rounds (-benchtime=Nx sets the rounds):
//
//   - prefill of 256 tokens in 16-token chunks on two neon units pinned to cores 0 and 1 (one
//     thread each; 16 chunks, so the two-stage pipeline's ideal is 2·16/17 = 1.88×, where 128
//     tokens would cap it at 1.78×; layers split in half: chunk i+1's first half runs while chunk i's second
//     half does) against one such unit alone and against one neon unit with two threads;
//   - decode with the layers split across the two units against one unit alone;
//   - bytes copied between units per decode step (the arena is imported by both: 0);
//   - for reference, one unit on core 1 (a shared machine's cores need not be equally fast)
//     and the share of a split decode step the units spend working (1: no time lost between
//     them).
//
// XPU_BENCH_MODEL=/tmp/1b.gguf go test ./llm -run '^$' -bench SchedulerTwoNeon -benchtime 3x
//
// XPU_BENCH_TRACE=file writes the two-unit runs' trace.
func BenchmarkSchedulerTwoNeonUnits(b *testing.B) {
	m := benchModel(b)
	devs := pluginDevices(b, "neon")
	ctx := context.Background()
	const chunk, promptLen, decodeSteps = 16, 256, 16
	var tr *sched.Trace
	if os.Getenv("XPU_BENCH_TRACE") != "" {
		tr = sched.NewTrace()
	}
	mk := func(units ...string) *Runner {
		specs := make([]sched.UnitSpec, len(units))
		for i, u := range units {
			s, err := sched.ParseUnitSpec(u)
			if err != nil {
				b.Fatal(err)
			}
			specs[i] = s
		}
		plan, err := DefaultPlan(m, devs, specs)
		if err != nil {
			b.Fatal(err)
		}
		var opts []RunnerOption
		if len(units) > 1 {
			opts = append(opts, WithTrace(tr))
		}
		r, err := NewPlannedRunner(ctx, m, devs, plan, append(opts, WithChunkSize(chunk),
			WithContextLength(promptLen+decodeSteps+1))...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { r.Close() })
		return r
	}
	type config struct {
		name            string
		r               *Runner
		prefill, decode []time.Duration
		decodeBusy      []time.Duration // all units' busy time per decode step
	}
	configs := []*config{
		{name: "one unit", r: mk("neon{cpus=0,threads=1}")},
		{name: "two units", r: mk("neon{cpus=0,threads=1}", "neon{cpus=1,threads=1}")},
		{name: "two threads", r: mk("neon{threads=2}")},
		{name: "one unit on core 1", r: mk("neon{cpus=1,threads=1}")},
	}
	busy := func(r *Runner) time.Duration {
		var d time.Duration
		for _, u := range r.Report().Units {
			d += u.Busy
		}
		return d
	}
	prompt := make([]int32, promptLen)
	for i := range prompt {
		prompt[i] = int32(3 + i%200)
	}
	var copied int64
	b.ResetTimer()
	for range b.N {
		for _, c := range configs {
			c.r.Reset()
			t0 := time.Now()
			if _, err := c.r.Prefill(ctx, prompt); err != nil {
				b.Fatal(err)
			}
			c.prefill = append(c.prefill, time.Since(t0))
			before, busy0 := c.r.Report().CopyBytes, busy(c.r)
			t0 = time.Now()
			for i := range decodeSteps {
				if _, err := c.r.Decode(ctx, int32(5+i)); err != nil {
					b.Fatal(err)
				}
			}
			c.decode = append(c.decode, time.Since(t0)/decodeSteps)
			c.decodeBusy = append(c.decodeBusy, (busy(c.r)-busy0)/decodeSteps)
			copied += c.r.Report().CopyBytes - before
		}
	}
	b.StopTimer()
	med := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[len(s)/2])
	}
	one, two, threads, one1 := configs[0], configs[1], configs[2], configs[3]
	tps := func(d float64) float64 { return promptLen / (d / 1e9) }
	b.ReportMetric(tps(med(one.prefill)), "prefill_1unit_tok/s")
	b.ReportMetric(tps(med(two.prefill)), "prefill_2units_tok/s")
	b.ReportMetric(tps(med(threads.prefill)), "prefill_2threads_tok/s")
	b.ReportMetric(med(one.prefill)/med(two.prefill), "prefill_2units/1unit")
	b.ReportMetric(med(threads.prefill)/med(two.prefill), "prefill_2units/2threads")
	b.ReportMetric(1e9/med(one.decode), "decode_1unit_tok/s")
	b.ReportMetric(1e9/med(two.decode), "decode_2units_tok/s")
	b.ReportMetric(med(one.decode)/med(two.decode), "decode_2units/1unit")
	// the cores are shared with the rest of the machine and need not be equally fast: the same
	// unit on core 1, and how much of a split step is work (1 = no time lost between units)
	b.ReportMetric(tps(med(one1.prefill)), "prefill_1unit_core1_tok/s")
	b.ReportMetric(1e9/med(one1.decode), "decode_1unit_core1_tok/s")
	b.ReportMetric(med(two.decodeBusy)/med(two.decode), "decode_2units_busy/wall")
	b.ReportMetric(float64(copied)/float64(b.N*len(configs)*decodeSteps), "copied_B/decode_step")
	for _, c := range configs {
		b.Logf("%s (%s): %s", c.name, c.r.Units(), c.r.Report())
	}
	if tr != nil {
		if err := tr.WriteFile(os.Getenv("XPU_BENCH_TRACE")); err != nil {
			b.Fatal(err)
		}
	}
}
