package hostsync

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Signal is a completion word, HeteroLLM's fast synchronisation on the host side: a producer
// publishes increasing sequence numbers (layer × step, say; never reset, so nothing has to
// re-arm it) and consumers wait until the value reaches theirs.
//
// Publish is one atomic store plus one atomic load while no consumer is blocked, so a producer
// whose consumer sleeps or spins pays no system call. Wait has three phases:
//
//  1. predicted sleep: when the caller expects the producer to need a while yet, it sleeps
//     until shortly before then with nanosleep on a locked OS thread. Go's time.Sleep is never
//     used: it rounds sub-millisecond sleeps up to about 1 ms (see the HeteroLLM digest §7);
//  2. a bounded spin on the word (a few µs by default: on a 2-core machine a spinning waiter
//     takes half the CPU, so it must be short);
//  3. a blocking wait (a futex on a word beside the sequence on Linux, a channel elsewhere)
//     until Publish or the context ends.
//
// The zero Signal is not usable; make one with NewSignal. A Signal is safe for concurrent use
// by any number of producers and consumers.
type Signal struct {
	seq     atomic.Uint64
	waiters atomic.Int32  // consumers in phase 3 (or in a long predicted sleep)
	epoch   atomic.Uint32 // bumped to wake blocked consumers; the futex word
	spin    time.Duration
	park    parker

	stats signalCounters
}

// parker blocks a consumer until word no longer holds val, it is woken, or timeout passes
// (spurious returns are allowed: the caller re-checks), and wakes every blocked consumer.
type parker interface {
	park(word *atomic.Uint32, val uint32, timeout time.Duration)
	unpark(word *atomic.Uint32)
}

// DefaultSpin is how long Wait spins on the word before blocking: long enough to catch a
// producer finishing right after a predicted sleep, short enough that a waiter does not steal
// a core from a producer on a 2-core machine. A spin handoff costs well under a microsecond and
// a blocking (futex) handoff several, so the budget covers about one blocking handoff.
const DefaultSpin = 5 * time.Microsecond

// maxPredictedSpin bounds the spin of a wait with a prediction: it covers the margin the sleep
// stopped short by (the overshoot estimate, 50–90 µs on a quiet machine), never more, so a
// prediction longer than the machine's timers can serve (a loaded machine, where the estimate
// grows) ends in the blocking wait rather than in a long spin that takes a core from the
// producer.
const maxPredictedSpin = 50 * time.Microsecond

// maxNanosleep bounds the predicted sleep done with nanosleep, which neither Publish nor the
// context can cut short. A longer prediction is slept in a blocking wait with a timeout instead,
// which both can end early; at that length the producer's wake-up system call is noise.
const maxNanosleep = time.Millisecond

// SignalOption configures a Signal.
type SignalOption func(*Signal)

// WithSpin sets how long Wait spins before it blocks (DefaultSpin if not given; 0 turns the
// spin off, negative values count as 0).
func WithSpin(d time.Duration) SignalOption {
	return func(s *Signal) { s.spin = max(d, 0) }
}

// withChannelParker makes the signal block on a channel even where futexes exist, so tests
// cover the portable path on Linux too.
func withChannelParker() SignalOption {
	return func(s *Signal) { s.park = &chanParker{} }
}

// NewSignal makes a signal whose value is 0.
func NewSignal(opts ...SignalOption) *Signal {
	s := &Signal{spin: DefaultSpin, park: newParker()}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Publish raises the value to seq (store-release; a value never goes down, so publishing a
// number at or below the current one does nothing) and wakes blocked waiters, only if there
// are any. Everything the producer wrote before Publish is visible to a consumer whose Wait for
// seq returned.
func (s *Signal) Publish(seq uint64) {
	for {
		cur := s.seq.Load()
		if seq <= cur {
			return
		}
		if s.seq.CompareAndSwap(cur, seq) {
			break
		}
	}
	// Go's atomics are sequentially consistent: either a waiter that registered in waiters
	// before this load sees it here, or it sees the new seq in its re-check before parking.
	if s.waiters.Load() > 0 {
		s.kick()
	}
}

// Load is the value last published (load-acquire).
func (s *Signal) Load() uint64 { return s.seq.Load() }

// kick wakes every blocked consumer; they re-check the value (and their context).
func (s *Signal) kick() {
	s.epoch.Add(1)
	s.park.unpark(&s.epoch)
}

// Wait returns nil once Load() >= seq, or ctx.Err() when ctx ends first. predicted is how long
// the caller expects the producer still needs (0 or less: unknown; Predictor.Remaining gives
// one). With a prediction, Wait sleeps until shortly before the expected finish (the prediction
// less the sleep's measured overshoot and the spin budget) and then spins until the spin budget
// past the expected finish, which covers the margin it woke early by (bounded by
// maxPredictedSpin plus the budget). Without one it spins for the spin budget only. Then it
// blocks.
func (s *Signal) Wait(ctx context.Context, seq uint64, predicted time.Duration) error {
	if s.seq.Load() >= seq {
		s.stats.ready.Add(1)
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.spin > 0 || predicted > 0 {
		begin := time.Now()
		spinEnd := begin.Add(s.spin)
		if predicted > 0 {
			margin := sleepOvershoot.estimate()
			d := predicted - margin - s.spin
			if d <= 0 && predicted-initialOvershoot-s.spin > 0 {
				// Too short to sleep only because past sleeps overshot: with no sleeps the
				// estimate would never learn that the machine quieted down, so a skipped
				// sleep counts as a sleep that overshot as little as the initial estimate.
				sleepOvershoot.observe(initialOvershoot)
			}
			if d > 0 {
				s.stats.slept.Add(1)
				if d <= maxNanosleep {
					preciseSleep(d)
				} else if err := s.block(ctx, seq, d); err != nil {
					return err
				}
				if s.seq.Load() >= seq {
					s.stats.afterSleep.Add(1)
					return nil
				}
			}
			if s.spin > 0 {
				now := time.Now()
				finish := begin.Add(predicted + s.spin)
				spinEnd = now.Add(s.spin)
				if finish.After(spinEnd) {
					spinEnd = minTime(finish, now.Add(min(margin, maxPredictedSpin)+s.spin))
				}
			}
		}
		if s.spin > 0 && s.spinUntil(seq, spinEnd) {
			s.stats.spun.Add(1)
			return nil
		}
	}
	s.stats.blocked.Add(1)
	return s.block(ctx, seq, 0)
}

// WaitSpinning is Wait for a consumer that owns its core: no predicted sleep (a sleep's
// wake-up costs tens of microseconds, more on a virtual machine whose idle vCPU must be
// woken), a spin of up to spin on the word, then the blocking wait. A waiter pinned to cores
// no producer runs on takes nothing from the producer by spinning, so spin can be the length
// of a typical wait rather than DefaultSpin's few microseconds.
func (s *Signal) WaitSpinning(ctx context.Context, seq uint64, spin time.Duration) error {
	if s.seq.Load() >= seq {
		s.stats.ready.Add(1)
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if spin > 0 && s.spinUntil(seq, time.Now().Add(spin)) {
		s.stats.spun.Add(1)
		return nil
	}
	s.stats.blocked.Add(1)
	return s.block(ctx, seq, 0)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// spinUntil polls the value until end; it reads the clock every few polls only, as a clock
// read costs more than a poll.
func (s *Signal) spinUntil(seq uint64, end time.Time) bool {
	for i := 0; ; i++ {
		if s.seq.Load() >= seq {
			return true
		}
		if i&15 == 15 && !time.Now().Before(end) {
			return s.seq.Load() >= seq
		}
	}
}

// block parks until the value reaches seq, ctx ends, or timeout (if > 0) passes; a timeout is
// not an error (the caller goes on to spin).
func (s *Signal) block(ctx context.Context, seq uint64, timeout time.Duration) error {
	s.waiters.Add(1)
	defer s.waiters.Add(-1)
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, s.kick)
		defer stop()
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		e := s.epoch.Load() // before the re-check: a Publish after it changes the word
		if s.seq.Load() >= seq {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var left time.Duration
		if timeout > 0 {
			if left = time.Until(deadline); left <= 0 {
				return nil
			}
		}
		s.park.park(&s.epoch, e, left)
	}
}

// SignalStats counts how Waits on a signal ended: what the fast-sync phases buy.
type SignalStats struct {
	Ready      uint64 // the value was already there: no wait at all
	Slept      uint64 // a predicted sleep was taken (the wait then ended in one of the next three)
	AfterSleep uint64 // the value was there when the sleep ended
	Spun       uint64 // the value arrived during the spin
	Blocked    uint64 // the wait blocked (it ended by Publish or by the context)
}

type signalCounters struct {
	ready, slept, afterSleep, spun, blocked atomic.Uint64
}

// Stats returns the wait counters since NewSignal.
func (s *Signal) Stats() SignalStats {
	return SignalStats{
		Ready: s.stats.ready.Load(), Slept: s.stats.slept.Load(), AfterSleep: s.stats.afterSleep.Load(),
		Spun: s.stats.spun.Load(), Blocked: s.stats.blocked.Load(),
	}
}

// preciseSleep sleeps d with nanosleep on a locked OS thread, and learns how far the kernel
// overshoots (timer slack and wake-up latency: tens of µs) so the
// next sleep can stop that much earlier.
func preciseSleep(d time.Duration) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := time.Now()
	nanosleep(d)
	sleepOvershoot.observe(time.Since(start) - d)
}

// overshootEstimator tracks the nanosleep overshoot as mean + 2 × mean deviation (the shape of
// TCP's retransmit timer), so most sleeps end before the producer does and the spin, not a
// late wake-up, catches the signal.
type overshootEstimator struct {
	mu        sync.Mutex
	mean, dev time.Duration
	cached    atomic.Int64
}

// initialOvershoot is the estimate before any sleep was measured: the digest's p50 for a short
// nanosleep with the default timer slack.
const initialOvershoot = 60 * time.Microsecond

var sleepOvershoot = newOvershootEstimator(initialOvershoot)

func newOvershootEstimator(initial time.Duration) *overshootEstimator {
	e := &overshootEstimator{}
	e.reset(initial)
	return e
}

// reset forgets what was learnt (tests that count sleeps start from the same estimate).
func (e *overshootEstimator) reset(initial time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.mean, e.dev = initial, initial/4
	e.cached.Store(int64(e.mean + 2*e.dev))
}

func (e *overshootEstimator) estimate() time.Duration { return time.Duration(e.cached.Load()) }

func (e *overshootEstimator) observe(o time.Duration) {
	// A sleeper preempted for long says little about the timer; capped, a few such sleeps on a
	// loaded machine still turn the sleep phase off (the estimate then exceeds the predictions),
	// and quiet sleeps turn it back on.
	o = min(max(o, 0), maxNanosleep)
	e.mu.Lock()
	defer e.mu.Unlock()
	diff := o - e.mean
	e.mean += diff / 8
	e.dev += (abs(diff) - e.dev) / 4
	e.cached.Store(int64(e.mean + 2*e.dev))
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// chanParker blocks on a channel that unpark closes: the portable fallback.
type chanParker struct {
	mu sync.Mutex
	ch chan struct{}
}

func (p *chanParker) park(word *atomic.Uint32, val uint32, timeout time.Duration) {
	p.mu.Lock()
	if word.Load() != val { // unpark ran after the caller's re-check: do not sleep
		p.mu.Unlock()
		return
	}
	if p.ch == nil {
		p.ch = make(chan struct{})
	}
	ch := p.ch
	p.mu.Unlock()
	if timeout <= 0 {
		<-ch
		return
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

func (p *chanParker) unpark(*atomic.Uint32) {
	p.mu.Lock()
	if p.ch != nil {
		close(p.ch)
		p.ch = nil
	}
	p.mu.Unlock()
}

// Predictor learns how long tasks take, per key (an op class on a unit, a partition, …), as an
// exponentially weighted moving average of observed durations, and turns that into the
// predicted time a Signal.Wait needs. It is safe for concurrent use; a nil *Predictor predicts
// nothing and learns nothing.
type Predictor[K comparable] struct {
	alpha float64
	mu    sync.Mutex
	est   map[K]time.Duration
}

// DefaultPredictorAlpha weights the newest observation: 1/4 follows a change within a few
// steps while one outlier moves the estimate by a quarter of its excess only.
const DefaultPredictorAlpha = 0.25

// NewPredictor makes a predictor that weights each new observation by alpha, in (0, 1]; other
// values mean DefaultPredictorAlpha.
func NewPredictor[K comparable](alpha float64) *Predictor[K] {
	if !(alpha > 0 && alpha <= 1) {
		alpha = DefaultPredictorAlpha
	}
	return &Predictor[K]{alpha: alpha, est: map[K]time.Duration{}}
}

// Observe records that key took d. The first observation is taken as it is; negative
// durations are ignored.
func (p *Predictor[K]) Observe(key K, d time.Duration) {
	if p == nil || d < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	old, ok := p.est[key]
	if !ok {
		p.est[key] = d
		return
	}
	p.est[key] = old + time.Duration(p.alpha*float64(d-old))
}

// Predict is the estimated duration of key and whether key was ever observed.
func (p *Predictor[K]) Predict(key K) (time.Duration, bool) {
	if p == nil {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	d, ok := p.est[key]
	return d, ok
}

// Remaining is how much longer a task of key that began at started is expected to run: the
// predicted argument of Signal.Wait. It is 0 for a key never observed or a task already past its
// estimate.
func (p *Predictor[K]) Remaining(key K, started time.Time) time.Duration {
	d, ok := p.Predict(key)
	if !ok {
		return 0
	}
	return max(d-time.Since(started), 0)
}
