package llm

import (
	"context"
	"fmt"
	"testing"

	"github.com/xpuhub/xpu/loader"
)

// BenchmarkVerifyPass times one pass of each graph length at position 64: decode (1) and the
// verify lengths, on the stories260K model and $XPU_BENCH_BACKEND (default neon):
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
	r, err := NewRunner(context.Background(), m, be.Devices()[0], WithVerifyLengths(8, 16, 32), WithContextLength(512),
		WithContextOptions(map[string]string{"threads": "1"}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	ctx := context.Background()
	prompt := make([]int32, 64)
	for i := range prompt {
		prompt[i] = int32(i + 10)
	}
	for _, l := range []int{1, 2, 8, 16, 32} {
		b.Run(fmt.Sprint(l), func(b *testing.B) {
			r.Reset()
			if _, err := r.Prefill(ctx, prompt); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := r.Verify(ctx, prompt[:l]); err != nil {
					b.Fatal(err)
				}
				if err := r.Truncate(64); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
