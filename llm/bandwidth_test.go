package llm

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
)

// BenchmarkReadBandwidth measures the machine's memory read bandwidth, the roofline of decode:
// GOMAXPROCS goroutines scan disjoint parts of a 512 MiB buffer (far larger than any cache)
// with bytes.IndexByte, which the runtime vectorizes, so the loop is not the bottleneck.
// Compare its GB/s with the "GB/s of weights" xpu run prints for decode.
func BenchmarkReadBandwidth(b *testing.B) {
	const size = 512 << 20
	// Filled, so every page is real memory (untouched pages all map the one zero page).
	buf := bytes.Repeat([]byte{0x55}, size)
	workers := runtime.GOMAXPROCS(0)
	part := size / workers
	found := make([]int, workers)
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				found[w] = bytes.IndexByte(buf[w*part:(w+1)*part], 0x01)
			}(w)
		}
		wg.Wait()
	}
	b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
	for _, f := range found {
		if f != -1 {
			b.Fatalf("found a byte that was never written")
		}
	}
}
