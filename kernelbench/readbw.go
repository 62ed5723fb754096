package kernelbench

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/xpuhub/xpu/core"
)

// ReadBandwidth measures the machine's memory read bandwidth in bytes per second without the
// C harness: threads goroutines scan disjoint parts of a buffer of size bytes (far larger than
// any cache) with bytes.IndexByte, which the runtime vectorizes, so the loop is not the
// bottleneck (the way llm's BenchmarkReadBandwidth measures it). The harness's read loop
// (Harness.Read), where it is built, is what `xpu bench --kernels` prints.
func ReadBandwidth(ctx context.Context, threads int, size int, minTime time.Duration) (float64, error) {
	if threads < 1 || size < threads {
		return 0, fmt.Errorf("bench: read bandwidth of %d bytes on %d threads: %w", size, threads, core.ErrInvalidArgument)
	}
	// filled, so every page is real memory (untouched pages all map the one zero page)
	buf := bytes.Repeat([]byte{0x55}, size)
	part := size / threads
	found := make([]int, threads)
	scan := func() error {
		var wg sync.WaitGroup
		for w := range threads {
			wg.Add(1)
			go func() {
				defer wg.Done()
				found[w] = bytes.IndexByte(buf[w*part:(w+1)*part], 0x01)
			}()
		}
		wg.Wait()
		for _, f := range found {
			if f != -1 {
				return fmt.Errorf("bench: read bandwidth: found a byte never written: %w", core.ErrInternal)
			}
		}
		return nil
	}
	d, err := Time(ctx, scan, 3, minTime)
	if err != nil {
		return 0, err
	}
	return float64(part*threads) / d.Seconds(), nil
}
