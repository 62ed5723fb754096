package hostsync

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// parkers are the blocking paths every behaviour test runs on.
var parkers = []struct {
	name string
	opts []SignalOption
}{
	{"default", nil},
	{"chan", []SignalOption{withChannelParker()}},
	{"nospin", []SignalOption{WithSpin(0)}},
}

func TestSignalPublishMonotonic(t *testing.T) {
	tests := []struct {
		publish []uint64
		want    uint64
	}{
		{nil, 0},
		{[]uint64{1, 2, 3}, 3},
		{[]uint64{5, 3}, 5}, // never goes down
		{[]uint64{7, 7}, 7},
		{[]uint64{0}, 0},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.publish), func(t *testing.T) {
			s := NewSignal()
			for _, v := range tt.publish {
				s.Publish(v)
			}
			assert.Equal(t, tt.want, s.Load())
		})
	}
}

func TestSignalWaitReady(t *testing.T) {
	s := NewSignal()
	s.Publish(4)
	for _, seq := range []uint64{0, 1, 4} {
		require.NoError(t, s.Wait(context.Background(), seq, time.Second), "seq %d", seq)
	}
	assert.Equal(t, SignalStats{Ready: 3}, s.Stats(), "no sleep, no spin when the value is there")
}

func TestSignalWaitWakes(t *testing.T) {
	tests := []struct {
		name      string
		predicted time.Duration
		delay     time.Duration // producer publishes this long after the wait starts
	}{
		{"idle", 0, 2 * time.Millisecond},
		{"predicted-exact", 300 * time.Microsecond, 300 * time.Microsecond},
		{"predicted-late", 200 * time.Microsecond, 3 * time.Millisecond}, // sleeps, spins, blocks
		{"predicted-long", 5 * time.Millisecond, 1 * time.Millisecond},   // blocking sleep, cut short
		{"immediate", 0, 0},
	}
	for _, p := range parkers {
		for _, tt := range tests {
			t.Run(p.name+"/"+tt.name, func(t *testing.T) {
				s := NewSignal(p.opts...)
				data := make([]int, 4)
				go func() {
					time.Sleep(tt.delay)
					for i := range data {
						data[i] = i + 1 // plain writes: Publish must make them visible (-race checks)
					}
					s.Publish(1)
				}()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				require.NoError(t, s.Wait(ctx, 1, tt.predicted))
				assert.Equal(t, []int{1, 2, 3, 4}, data)
				st := s.Stats()
				assert.Equal(t, uint64(1), st.Ready+st.AfterSleep+st.Spun+st.Blocked, "%+v", st)
			})
		}
	}
}

// publishWhenBlocked publishes seq once a consumer is blocked on s.
func publishWhenBlocked(s *Signal, seq uint64) {
	for s.waiters.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	s.Publish(seq)
}

func TestSignalWaitPaths(t *testing.T) {
	// A wait that no one publishes for long ends in the blocking phase; one whose producer
	// is long past its prediction has slept first.
	s := NewSignal()
	go publishWhenBlocked(s, 1)
	require.NoError(t, s.Wait(context.Background(), 1, 0))
	assert.Equal(t, SignalStats{Blocked: 1}, s.Stats())

	sleepOvershoot.reset(initialOvershoot) // earlier sleeps on a loaded machine may have turned sleeping off
	s = NewSignal()
	go publishWhenBlocked(s, 1)
	require.NoError(t, s.Wait(context.Background(), 1, 500*time.Microsecond))
	assert.Equal(t, SignalStats{Slept: 1, Blocked: 1}, s.Stats())
}

func TestSignalWaitContext(t *testing.T) {
	for _, p := range parkers {
		t.Run(p.name+"/already-cancelled", func(t *testing.T) {
			s := NewSignal(p.opts...)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			assert.ErrorIs(t, s.Wait(ctx, 1, time.Millisecond), context.Canceled)
		})
		for _, predicted := range []time.Duration{0, 300 * time.Microsecond, time.Hour} {
			t.Run(fmt.Sprintf("%s/deadline-predicted-%v", p.name, predicted), func(t *testing.T) {
				s := NewSignal(p.opts...)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				defer cancel()
				start := time.Now()
				assert.ErrorIs(t, s.Wait(ctx, 1, predicted), context.DeadlineExceeded)
				assert.Less(t, time.Since(start), 5*time.Second, "the context ends the wait")
				s.Publish(1) // nobody is left waiting: no wake needed, none blocks
				assert.Zero(t, s.waiters.Load())
			})
		}
	}
}

func TestSignalManyWaiters(t *testing.T) {
	for _, p := range parkers {
		t.Run(p.name, func(t *testing.T) {
			s := NewSignal(p.opts...)
			const steps, consumers = 50, 4
			out := make([][]uint64, consumers)
			var wg sync.WaitGroup
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for c := range consumers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for seq := uint64(1); seq <= steps; seq++ {
						if !assert.NoError(t, s.Wait(ctx, seq, time.Duration(c)*50*time.Microsecond)) {
							return
						}
						out[c] = append(out[c], s.Load())
					}
				}()
			}
			for seq := uint64(1); seq <= steps; seq++ {
				if seq%7 == 0 {
					time.Sleep(100 * time.Microsecond)
				} else {
					runtime.Gosched()
				}
				s.Publish(seq)
			}
			wg.Wait()
			for c := range consumers {
				require.Len(t, out[c], steps)
				for i, v := range out[c] {
					assert.GreaterOrEqual(t, v, uint64(i+1), "consumer %d returned before its seq", c)
				}
			}
			assert.Zero(t, s.waiters.Load())
		})
	}
}

func TestWithSpinNegative(t *testing.T) {
	assert.Equal(t, time.Duration(0), NewSignal(WithSpin(-time.Second)).spin)
	assert.Equal(t, DefaultSpin, NewSignal().spin)
}

func TestOvershootEstimator(t *testing.T) {
	e := newOvershootEstimator(60 * time.Microsecond)
	assert.Equal(t, 90*time.Microsecond, e.estimate(), "mean + 2 × deviation to start")
	for range 200 {
		e.observe(20 * time.Microsecond)
	}
	assert.InDelta(t, float64(20*time.Microsecond), float64(e.estimate()), float64(time.Microsecond),
		"a steady overshoot is learnt, with its deviation gone")
	e.observe(time.Hour) // a preempted sleeper counts as maxNanosleep at most
	assert.Less(t, e.estimate(), 3*maxNanosleep)
	e.observe(-time.Second) // a clock oddity counts as 0
	assert.GreaterOrEqual(t, e.estimate(), time.Duration(0))
}

func TestPredictor(t *testing.T) {
	tests := []struct {
		name    string
		alpha   float64
		observe []time.Duration
		want    time.Duration
		known   bool
	}{
		{"unknown", 0.5, nil, 0, false},
		{"first taken as is", 0.5, []time.Duration{100}, 100, true},
		{"ewma", 0.5, []time.Duration{100, 200}, 150, true},
		{"ewma twice", 0.5, []time.Duration{100, 200, 200}, 175, true},
		{"alpha 1 follows", 1, []time.Duration{100, 300}, 300, true},
		{"bad alpha is the default", 7, []time.Duration{100, 500}, 200, true},
		{"negative ignored", 0.5, []time.Duration{100, -50}, 100, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPredictor[string](tt.alpha)
			for _, d := range tt.observe {
				p.Observe("k", d)
			}
			got, ok := p.Predict("k")
			assert.Equal(t, tt.known, ok)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestPredictorRemaining(t *testing.T) {
	type key struct {
		unit  string
		layer int
	}
	p := NewPredictor[key](0)
	k := key{"neon:0", 3}
	assert.Zero(t, p.Remaining(k, time.Now()), "unknown key")
	p.Observe(k, time.Hour)
	r := p.Remaining(k, time.Now().Add(-time.Minute))
	assert.InDelta(t, float64(59*time.Minute), float64(r), float64(time.Second))
	assert.Zero(t, p.Remaining(k, time.Now().Add(-2*time.Hour)), "a task past its estimate")

	var nilP *Predictor[key]
	nilP.Observe(k, time.Second)
	_, ok := nilP.Predict(k)
	assert.False(t, ok)
	assert.Zero(t, nilP.Remaining(k, time.Now()))
}

func TestPredictorConcurrent(t *testing.T) {
	p := NewPredictor[int](0.25)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				p.Observe(w%2, time.Millisecond)
				p.Remaining(w%2, time.Now())
			}
		}()
	}
	wg.Wait()
	d, ok := p.Predict(0)
	assert.True(t, ok)
	assert.Equal(t, time.Millisecond, d)
}

// TestSignalNoLeak: waits that end by their context, by Publish or by a long predicted sleep
// leave no goroutine behind (the context's wake-up hook is removed with the wait).
func TestSignalNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	for _, p := range parkers {
		s := NewSignal(p.opts...)
		for i := range 20 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%3)*time.Millisecond)
			_ = s.Wait(ctx, 1, time.Duration(i%4)*time.Millisecond)
			cancel()
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- s.Wait(ctx, 2, 0) }()
		go publishWhenBlocked(s, 2)
		require.NoError(t, <-done)
		cancel()
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), before)
}

// TestSignalWaitSpinning: a ready value returns at once, a value published during the spin
// ends the wait there, a spin that runs out blocks until Publish, and the context ends a
// blocked wait; spin 0 blocks at once.
func TestSignalWaitSpinning(t *testing.T) {
	tests := []struct {
		name    string
		spin    time.Duration
		publish func(s *Signal) // run on another goroutine, may be nil
		ready   bool            // published before the wait
		want    SignalStats
	}{
		{name: "ready", spin: time.Millisecond, ready: true, want: SignalStats{Ready: 1}},
		{name: "spun", spin: 10 * time.Second, publish: func(s *Signal) { time.Sleep(time.Millisecond); s.Publish(1) },
			want: SignalStats{Spun: 1}},
		{name: "spin-then-block", spin: 100 * time.Microsecond, publish: func(s *Signal) { publishWhenBlocked(s, 1) },
			want: SignalStats{Blocked: 1}},
		{name: "no-spin", spin: 0, publish: func(s *Signal) { publishWhenBlocked(s, 1) }, want: SignalStats{Blocked: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSignal()
			if tc.ready {
				s.Publish(1)
			}
			if tc.publish != nil {
				go tc.publish(s)
			}
			require.NoError(t, s.WaitSpinning(context.Background(), 1, tc.spin))
			assert.Equal(t, tc.want, s.Stats())
			assert.Zero(t, s.waiters.Load())
		})
	}
	t.Run("context", func(t *testing.T) {
		s := NewSignal()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		assert.ErrorIs(t, s.WaitSpinning(ctx, 1, 100*time.Microsecond), context.DeadlineExceeded)
		cancelled, stop := context.WithCancel(context.Background())
		stop()
		assert.ErrorIs(t, s.WaitSpinning(cancelled, 1, time.Second), context.Canceled)
	})
}
