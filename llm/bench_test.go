package llm

import (
	"context"
	"os"
	"testing"

	"github.com/xpuhub/xpu/loader"
)

// benchRunner opens $XPU_BENCH_MODEL (default: a synthetic 15M-parameter Q4_0 model) on
// $XPU_BENCH_BACKEND (default ref), e.g.
//
//	XPU_BENCH_MODEL=/tmp/llama1b-q4_0.gguf XPU_BENCH_BACKEND=neon go test ./llm -run X -bench Decode
func benchRunner(b *testing.B, chunk int) *Runner {
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
	r, err := NewRunner(context.Background(), m, be.Devices()[0], WithChunkSize(chunk), WithContextLength(512))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	return r
}

// BenchmarkDecode reports tokens/s and the weight bytes streamed per second (GB/s), to hold
// against BenchmarkReadBandwidth.
func BenchmarkDecode(b *testing.B) {
	r := benchRunner(b, 1)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if r.Len() >= r.ContextLength() {
			r.Reset()
		}
		if _, err := r.Decode(ctx, 5); err != nil {
			b.Fatal(err)
		}
	}
	s := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N)/s, "tok/s")
	b.ReportMetric(float64(r.Model().WeightBytes())*float64(b.N)/s/1e9, "GB/s")
}

// BenchmarkPrefill reports prompt tokens/s for 32-token chunks.
func BenchmarkPrefill(b *testing.B) {
	r := benchRunner(b, 32)
	ctx := context.Background()
	prompt := make([]int32, 128)
	for i := range prompt {
		prompt[i] = int32(3 + i%200)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r.Reset()
		if _, err := r.Prefill(ctx, prompt); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(prompt))/b.Elapsed().Seconds(), "tok/s")
}
