package llm

import (
	"runtime"
	"sync"
	"testing"
)

// BenchmarkReadBandwidth measures the machine's memory read bandwidth, the roofline of decode:
// GOMAXPROCS goroutines sum disjoint parts of a 512 MiB buffer (far larger than any cache).
// Compare its GB/s with the "GB/s of weights" xpu run prints for decode.
func BenchmarkReadBandwidth(b *testing.B) {
	const size = 512 << 20
	buf := make([]uint64, size/8)
	for i := range buf {
		buf[i] = uint64(i)
	}
	workers := runtime.GOMAXPROCS(0)
	part := len(buf) / workers
	sums := make([]uint64, workers)
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				var s0, s1, s2, s3 uint64
				p := buf[w*part : (w+1)*part]
				for j := 0; j+4 <= len(p); j += 4 {
					s0 += p[j]
					s1 += p[j+1]
					s2 += p[j+2]
					s3 += p[j+3]
				}
				sums[w] = s0 + s1 + s2 + s3
			}(w)
		}
		wg.Wait()
	}
	b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
	if sums[0] == 1 {
		b.Log("unlikely") // keeps the sums alive
	}
}
