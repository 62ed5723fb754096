package hostsync

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
	// produced, if set, is told after each round how long the producer took from the
	// consumer's start of the wait to its publish: what a predictor should learn (the wait's
	// own length would include the wake-up's lateness, and late wake-ups would feed on
	// themselves).
	produced func(d time.Duration)
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
			begin := nowNS()
			ready.Store(uint64(i))
			w.wait(uint64(i))
			pub := t0.Load()
			lat[i-1] = nowNS() - pub
			if w.produced != nil {
				w.produced(time.Duration(pub - begin))
			}
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
	// signal waits with no prediction, or (learn) with the one a Predictor learnt from the
	// earlier rounds' waits, as a unit would predict its producer.
	signal := func(learn bool, opts ...SignalOption) func(*testing.B) {
		return func(b *testing.B) {
			s := NewSignal(opts...)
			pred := NewPredictor[int](0)
			benchHandoff(b, handoffWaiter{
				wait: func(i uint64) {
					var predicted time.Duration
					if learn {
						predicted = pred.Remaining(0, time.Now())
					}
					if err := s.Wait(ctx, i, predicted); err != nil {
						b.Error(err)
					}
				},
				publish:  s.Publish,
				produced: func(d time.Duration) { pred.Observe(0, d) },
			})
			st := s.Stats()
			n := float64(b.N)
			b.ReportMetric(float64(st.Slept)/n, "slept/op")
			b.ReportMetric(float64(st.AfterSleep)/n, "after-sleep/op")
			b.ReportMetric(float64(st.Spun)/n, "spun/op")
			b.ReportMetric(float64(st.Blocked)/n, "blocked/op")
		}
	}
	// The consumer knows nothing: spin DefaultSpin, then block on the futex.
	b.Run("signal/idle", signal(false))
	// The consumer blocks at once (no spin): the futex wake alone.
	b.Run("signal/idle-nospin", signal(false, WithSpin(0)))
	// The consumer predicts the producer's time (EWMA of the earlier rounds): nanosleep short
	// of it, spin until DefaultSpin past it, block.
	b.Run("signal/predicted", signal(true))
	// The same with a 20 µs spin budget: more waits end in the spin, at more CPU.
	b.Run("signal/predicted-spin20", signal(true, WithSpin(20*time.Microsecond)))
	// The same through the portable channel parker.
	b.Run("signal/predicted-chanparker", signal(true, withChannelParker()))
	// Lower bound: an unbounded spin on the word (takes a whole core for the wait).
	b.Run("spin/unbounded", signal(false, WithSpin(time.Hour)))
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

// BenchmarkSleepOvershoot measures how late a 50 µs sleep ends: nanosleep on a locked thread
// (what Wait's predicted sleep uses) next to Go's time.Sleep, p50 and p99 of the overshoot.
//
//	go test -run '^$' -bench SleepOvershoot ./sched/
func BenchmarkSleepOvershoot(b *testing.B) {
	const d = 50 * time.Microsecond
	for _, tc := range []struct {
		name  string
		sleep func()
	}{
		{"nanosleep-locked", func() { nanosleep(d) }},
		{"time.Sleep", func() { time.Sleep(d) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			over := make([]int64, b.N)
			for i := range over {
				start := time.Now()
				tc.sleep()
				over[i] = int64(time.Since(start) - d)
			}
			slices.Sort(over)
			b.ReportMetric(float64(over[len(over)/2])/1e3, "p50-µs")
			b.ReportMetric(float64(over[(len(over)-1)*99/100])/1e3, "p99-µs")
		})
	}
}
