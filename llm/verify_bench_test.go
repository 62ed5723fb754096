package llm

import (
	"context"
	"fmt"
	"testing"

	"github.com/xpuhub/xpu/loader"
)

// BenchmarkVerifyPass times one pass of each graph length at cache positions 64 and 480 (the
// second is where bench/spec.sh's summary task decodes: a 433-token prompt, 200 tokens):
// decode (1) and the verify lengths, on the stories260K model and neon, 1 thread; cpu-ns/op is
// the process's CPU time per pass:
//
//	go test ./llm -run X -bench VerifyPass
func BenchmarkVerifyPass(b *testing.B) {
	m := openStories(b)
	name := "neon"
	be, err := loader.Open(context.Background(), name)
	if err != nil {
		b.Skipf("backend %s: %v", name, err)
	}
	b.Cleanup(func() { be.Close() })
	r, err := NewRunner(context.Background(), m, be.Devices()[0], WithVerifyLengths(2, 4, 8, 16, 32), WithContextLength(1024),
		WithContextOptions(map[string]string{"threads": "1"}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	ctx := context.Background()
	for _, pos := range []int{64, 480} {
		prompt := make([]int32, pos)
		for i := range prompt {
			prompt[i] = int32(i%500 + 10)
		}
		for _, l := range []int{1, 2, 4, 8, 16, 32} {
			b.Run(fmt.Sprintf("pos=%d/len=%d", pos, l), func(b *testing.B) {
				r.Reset()
				if _, err := r.Prefill(ctx, prompt); err != nil {
					b.Fatal(err)
				}
				cpu0 := cpuTime()
				for b.Loop() {
					if _, err := r.Verify(ctx, prompt[:l]); err != nil {
						b.Fatal(err)
					}
					if err := r.Truncate(pos); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			})
		}
	}
}
