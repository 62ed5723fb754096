package batch

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/llmtest"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/synth"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched/energy"
)

// BenchmarkBatchDecode reports the aggregate decode tokens/s of 1 to 8 sequences decoding at
// once through one Batch (a step per iteration, every sequence in it), and the process's CPU
// time per token (user + system: on a shared machine, where wall time depends on the other
// processes, the work a token costs), on $XPU_BENCH_MODEL and $XPU_BENCH_BACKEND as
// llm's BenchmarkDecode:
//
//	XPU_BENCH_MODEL=build/models/llama-1b-q4_0.gguf XPU_BENCH_BACKEND=neon go test ./llm/batch -run X -bench BatchDecode
func BenchmarkBatchDecode(b *testing.B) {
	m := benchModel(b)
	name := os.Getenv("XPU_BENCH_BACKEND")
	if name == "" {
		name = loader.RefName
	}
	be, err := loader.Open(context.Background(), name)
	if err != nil {
		b.Skipf("backend %s: %v", name, err)
	}
	b.Cleanup(func() { be.Close() })
	bt, err := New(context.Background(), m, be.Devices()[0], 8, llm.WithContextLength(512))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bt.Close() })
	ctx := context.Background()
	for _, w := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("seqs=%d", w), func(b *testing.B) {
			rs := bt.Runners()[:w]
			for _, r := range rs {
				r.Reset()
			}
			cpu0 := cpuTime()
			b.ResetTimer()
			for range b.N {
				var wg sync.WaitGroup
				for _, r := range rs {
					if r.Len() >= r.ContextLength() {
						r.Reset()
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						if _, err := r.Decode(ctx, 5); err != nil {
							b.Error(err)
						}
					}()
				}
				wg.Wait()
			}
			b.ReportMetric(float64(w*b.N)/b.Elapsed().Seconds(), "tok/s")
			b.ReportMetric(float64((cpuTime()-cpu0).Milliseconds())/float64(w*b.N), "cpu-ms/tok")
		})
	}
	// the same MATMULs (M = 8) as a step of 8 sequences, as one sequence's prompt chunk with one
	// attention: what the batched step's per-sequence attention and K/V rows add
	b.Run("chunk=8", func(b *testing.B) {
		r, sl := bt.Runners()[0], bt.slots[0]
		r.Reset()
		tokens := []int32{5, 6, 7, 8, 9, 10, 11, 12}
		cpu0 := cpuTime()
		b.ResetTimer()
		for range b.N {
			if r.Len()+len(tokens) > r.ContextLength() {
				r.Reset()
			}
			if _, err := sl.feed(ctx, tokens, InterleaveChunk); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(8*b.N)/b.Elapsed().Seconds(), "tok/s")
		b.ReportMetric(float64((cpuTime()-cpu0).Milliseconds())/float64(8*b.N), "cpu-ms/tok")
	})
}

// benchModel is $XPU_BENCH_MODEL, or a generated Llama of 15M parameters in Q4_0.
func benchModel(b *testing.B) *llm.Model {
	path := os.Getenv("XPU_BENCH_MODEL")
	if path == "" {
		spec, err := synth.Preset("llama", "15M", core.Q4_0, 1)
		if err != nil {
			b.Fatal(err)
		}
		return llmtest.Synth(b, spec)
	}
	m, err := llm.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = m.Close() })
	return m
}

// cpuTime is the CPU time this process has used so far (0 where the platform does not say).
func cpuTime() time.Duration {
	t, _ := energy.ProcessCPUTime()
	return t
}
