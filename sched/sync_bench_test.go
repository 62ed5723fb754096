package sched

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// handoffGap is how long the producer works (a busy loop on its own locked thread) between the
// consumer starting to wait and the producer publishing: the order of a decode MATMUL.
const handoffGap = 200 * time.Microsecond

// handoffWaiter is one way for the consumer to wait for round i; prepare (optional) runs on
// the producer's side before its busy work, publish right after it.
type handoffWaiter struct {
	wait    func(i uint64)
	publish func(i uint64)
}

// benchHandoff measures, per round, the time from the producer's publish (the clock read just
// before it) to the consumer's return from its wait, with producer and consumer on two locked
// OS threads, and reports p50 and p99 in µs. Each round the consumer announces it is waiting,
// the producer works for handoffGap and publishes.
func benchHandoff(b *testing.B, w handoffWaiter) {
	base := time.Now()
	nowNS := func() int64 { return int64(time.Since(base)) }
	var ready atomic.Uint64
	var t0 atomic.Int64
	lat := make([]int64, b.N)
	var wg sync.WaitGroup
	wg.Add(2)
	b.ResetTimer()
	go func() { // consumer
		defer wg.Done()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for i := 1; i <= b.N; i++ {
			ready.Store(uint64(i))
			w.wait(uint64(i))
			lat[i-1] = nowNS() - t0.Load()
		}
	}()
	go func() { // producer
		defer wg.Done()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for i := 1; i <= b.N; i++ {
			for ready.Load() != uint64(i) {
			}
			for start := time.Now(); time.Since(start) < handoffGap; {
			}
			t0.Store(nowNS())
			w.publish(uint64(i))
		}
	}()
	wg.Wait()
	b.StopTimer()
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1e3 }
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// BenchmarkHandoff compares the Signal's handoff with the alternatives, in one run:
//
//	go test -run '^$' -bench Handoff ./sched/
func BenchmarkHandoff(b *testing.B) {
	ctx := context.Background()
	signal := func(predicted time.Duration, opts ...SignalOption) func(*testing.B) {
		return func(b *testing.B) {
			s := NewSignal(opts...)
			benchHandoff(b, handoffWaiter{
				wait: func(i uint64) {
					if err := s.Wait(ctx, i, predicted); err != nil {
						b.Error(err)
					}
				},
				publish: s.Publish,
			})
			st := s.Stats()
			n := float64(b.N)
			b.ReportMetric(float64(st.AfterSleep+st.Spun)/n, "caught-by-spin")
		}
	}
	// The consumer knows nothing: spin DefaultSpin, then block on the futex.
	b.Run("signal/idle", signal(0))
	// The consumer blocks at once (no spin): the futex wake alone.
	b.Run("signal/idle-nospin", signal(0, WithSpin(0)))
	// The consumer expects the producer's time: nanosleep short of it, spin, block.
	b.Run("signal/predicted", signal(handoffGap))
	// The same through the portable channel parker.
	b.Run("signal/predicted-chanparker", signal(handoffGap, withChannelParker()))
	// Lower bound: an unbounded spin on the word (takes a whole core for the wait).
	b.Run("spin/unbounded", signal(0, WithSpin(time.Hour)))
	// Go's time.Sleep for the predicted part, then the signal: what not to do.
	b.Run("timesleep/predicted", func(b *testing.B) {
		s := NewSignal()
		benchHandoff(b, handoffWaiter{
			wait: func(i uint64) {
				time.Sleep(handoffGap - 2*DefaultSpin)
				if err := s.Wait(ctx, i, 0); err != nil {
					b.Error(err)
				}
			},
			publish: s.Publish,
		})
	})
	b.Run("chan", func(b *testing.B) {
		ch := make(chan uint64)
		benchHandoff(b, handoffWaiter{
			wait:    func(uint64) { <-ch },
			publish: func(i uint64) { ch <- i },
		})
	})
	b.Run("cond", func(b *testing.B) {
		var mu sync.Mutex
		cond := sync.NewCond(&mu)
		var v uint64
		benchHandoff(b, handoffWaiter{
			wait: func(i uint64) {
				mu.Lock()
				for v < i {
					cond.Wait()
				}
				mu.Unlock()
			},
			publish: func(i uint64) {
				mu.Lock()
				v = i
				cond.Broadcast()
				mu.Unlock()
			},
		})
	})
}

// BenchmarkPublishNoWaiter is the producer's cost when nobody blocks: what a unit pays per
// published output on the hot path.
func BenchmarkPublishNoWaiter(b *testing.B) {
	s := NewSignal()
	for i := 0; i < b.N; i++ {
		s.Publish(uint64(i + 1))
	}
}
