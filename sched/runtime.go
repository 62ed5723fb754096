package sched

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched/dag"
	"github.com/xpuhub/xpu/sched/hostsync"
)

// Runtime runs programs — graphs cut into partitions over several units — on its units. It owns
// the units (their contexts), an Arena every unit imports, and one worker per unit: a goroutine
// locked to its OS thread that runs that unit's tasks in order, waiting on other units' Signals
// where a task consumes what another unit produced (no trip through the Go scheduler per edge).
//
// Requests (Program.Run) from several goroutines run concurrently where they use different
// units (one sequence's decode on one unit while another sequence's prefill runs on another);
// on a shared unit they run in the order they were dispatched. One Program runs one request at
// a time. Close the runtime after its programs' last Run.
type Runtime struct {
	cfg     runtimeConfig
	units   []*Unit
	mem     []*unitMem // per unit: its view of the arena
	arena   *Arena
	workers []*rtWorker
	pred    *hostsync.Predictor[taskKey]
	exes    *exeCache // prepared executables, shared by programs

	runMu    sync.Mutex // dispatch: sequence numbers and job order agree on every unit
	inflight sync.WaitGroup
	mu       sync.Mutex // programs, closed
	programs []*Program
	closed   bool
	broken   error // a unit crashed: the runtime must be rebuilt

	copies, copyBytes atomic.Int64 // arena ↔ mirror copies for units that import nothing
	runs              atomic.Int64
	phases            map[Phase]*PhaseStats // under mu

	releaseProcs func()        // gives back the GOMAXPROCS headroom (nil: none taken)
	epochs       atomic.Uint32 // request chunks planned, for stealing tasks' claim words
}

type runtimeConfig struct {
	trace      *Trace
	logger     *slog.Logger
	policy     dag.Policy
	pinnedSpin time.Duration
	noHeadroom bool
	cacheSize  int
}

// RuntimeOption configures NewRuntime.
type RuntimeOption func(*runtimeConfig)

// WithRuntimeTrace records every task, wait and copy in t (one track per unit).
func WithRuntimeTrace(t *Trace) RuntimeOption { return func(c *runtimeConfig) { c.trace = t } }

// WithDispatchPolicy sets the order in which each unit runs a request's tasks: the policy is
// run on a simulation with the durations earlier runs measured, and each unit's queue takes
// the simulated order. Default dag.OutOfOrder; dag.InOrder runs every unit's tasks in chunk
// order (the baseline that leaves bubbles).
func WithDispatchPolicy(p dag.Policy) RuntimeOption {
	return func(c *runtimeConfig) {
		if p != nil {
			c.policy = p
		}
	}
}

// WithPinnedSpin sets how long a unit's worker spins on another unit's signal before it
// blocks, when both workers are pinned to disjoint cores (units with a cpus option: the
// worker's thread is restricted to those CPUs), and the wait is not predicted to be longer.
// Default DefaultPinnedSpin; 0 blocks at once. Workers that are not both pinned keep the
// predicted sleep and the short spin of Signal.Wait.
func WithPinnedSpin(d time.Duration) RuntimeOption {
	return func(c *runtimeConfig) { c.pinnedSpin = max(d, 0) }
}

// WithProcHeadroom(false) stops the runtime from raising GOMAXPROCS. By default, while the
// runtime is open, GOMAXPROCS is at least one more than the workers of all open runtimes: a
// worker inside a backend call holds its P in the system-call state, and without an idle P
// Go's sysmon takes it away every 20 µs and wakes a thread that preempts a worker (procs.go
// says what that cost a split decode). The previous value comes back when the last runtime
// closes.
func WithProcHeadroom(on bool) RuntimeOption {
	return func(c *runtimeConfig) { c.noHeadroom = !on }
}

// WithRuntimeLogger sets the logger (default slog.Default()).
func WithRuntimeLogger(l *slog.Logger) RuntimeOption {
	return func(c *runtimeConfig) { c.logger = l }
}

// WithRuntimeCacheSize sets how many prepared executables no program uses the runtime keeps
// for a later Compile of the same graph on the same unit (default DefaultCacheSize; 0 closes
// each with its last program).
func WithRuntimeCacheSize(n int) RuntimeOption {
	return func(c *runtimeConfig) { c.cacheSize = max(n, 0) }
}

// NewRuntime opens one unit per spec on the device of devices it names (FindDevice) and starts
// their workers.
func NewRuntime(ctx context.Context, devices []core.Device, specs []UnitSpec, opts ...RuntimeOption) (*Runtime, error) {
	cfg := newRuntimeConfig(opts)
	if len(specs) == 0 {
		return nil, fmt.Errorf("runtime: no units: %w", core.ErrInvalidArgument)
	}
	rt := newRuntime(cfg)
	for i, s := range specs {
		for _, prev := range specs[:i] {
			if prev.String() == s.String() {
				return nil, errors.Join(fmt.Errorf("runtime: unit %s given twice: %w", s, core.ErrInvalidArgument), rt.Close())
			}
		}
		dev, err := FindDevice(s, devices)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("runtime: %w", err), rt.Close())
		}
		u, err := OpenUnit(ctx, dev, s)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("runtime: %w", err), rt.Close())
		}
		rt.startUnit(u)
	}
	if !cfg.noHeadroom {
		rt.releaseProcs = reserveProcs(len(rt.workers))
	}
	return rt, nil
}

func newRuntimeConfig(opts []RuntimeOption) runtimeConfig {
	cfg := runtimeConfig{logger: slog.Default(), policy: dag.OutOfOrder, pinnedSpin: DefaultPinnedSpin,
		cacheSize: DefaultCacheSize}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	return cfg
}

// newRuntime is a runtime with no units yet.
func newRuntime(cfg runtimeConfig) *Runtime {
	return &Runtime{cfg: cfg, arena: NewArena(), pred: hostsync.NewPredictor[taskKey](0),
		exes: newExeCache(cfg.cacheSize, cfg.logger)}
}

// startUnit adds an open unit (the runtime owns it from now on) with its arena view and its
// worker, and returns its index.
func (rt *Runtime) startUnit(u *Unit) int {
	rt.mu.Lock()
	i := len(rt.units)
	rt.units = append(rt.units, u)
	rt.mem = append(rt.mem, &unitMem{mode: modeFor(u.Device().Info().Caps)})
	// buffered: dispatching a request never waits for a unit busy with an earlier one
	w := &rtWorker{rt: rt, idx: i, sig: hostsync.NewSignal(), jobs: make(chan *rtJob, 64), exited: make(chan struct{}),
		pinned: make(chan struct{})}
	rt.workers = append(rt.workers, w)
	rt.mu.Unlock()
	go w.loop()
	<-w.pinned
	return i
}

// lockRun takes the dispatch lock (runMu) for op, failing when the runtime is closed: what
// Compile, addUnit and rebind change, the workers read while a request runs. The caller
// unlocks runMu.
func (rt *Runtime) lockRun(op string) error {
	rt.runMu.Lock()
	rt.mu.Lock()
	closed := rt.closed
	rt.mu.Unlock()
	if closed {
		rt.runMu.Unlock()
		return fmt.Errorf("runtime: %s: closed: %w", op, core.ErrBadState)
	}
	return nil
}

// addUnit adds an open unit to a running runtime, which owns it from now on, and returns its
// index: the Executor grows its runtime as sessions place nodes on units it had not used. It
// waits for the requests in flight (their workers read the unit tables) and holds back new
// ones meanwhile.
func (rt *Runtime) addUnit(u *Unit) (int, error) {
	if err := rt.lockRun("add unit " + u.Name()); err != nil {
		return 0, err
	}
	defer rt.runMu.Unlock()
	rt.inflight.Wait()
	i := rt.startUnit(u)
	if !rt.cfg.noHeadroom {
		prev, release := rt.releaseProcs, reserveProcs(1)
		rt.releaseProcs = func() {
			if prev != nil {
				prev()
			}
			release()
		}
	}
	return i, nil
}

// Units are the runtime's units, in the order of the specs.
func (rt *Runtime) Units() []*Unit {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return slices.Clone(rt.units)
}

// Arena is the memory every unit sees.
func (rt *Runtime) Arena() *Arena { return rt.arena }

// Trace is the trace the runtime records into (nil: none).
func (rt *Runtime) Trace() *Trace { return rt.cfg.trace }

// Close stops the workers and releases every program, the arena imports, the arena and the
// units' contexts.
func (rt *Runtime) Close() error {
	rt.runMu.Lock()
	rt.mu.Lock()
	if rt.closed {
		rt.mu.Unlock()
		rt.runMu.Unlock()
		return nil
	}
	rt.closed = true
	progs := rt.programs
	rt.programs = nil
	rt.mu.Unlock()
	rt.runMu.Unlock()
	rt.inflight.Wait()
	var errs []error
	for _, w := range rt.workers {
		close(w.jobs)
		<-w.exited
	}
	if rt.releaseProcs != nil {
		rt.releaseProcs()
	}
	for _, p := range progs {
		errs = append(errs, p.release())
	}
	// after the programs gave their references back, before the contexts close
	errs = append(errs, rt.exes.close())
	for _, m := range rt.mem {
		errs = append(errs, m.close())
	}
	errs = append(errs, rt.arena.Close())
	for _, u := range rt.units {
		errs = append(errs, u.Close())
	}
	if rt.broken != nil {
		// a crashed backend cannot release what it held: that is the crash, reported by Run
		errs = slices.DeleteFunc(errs, func(e error) bool { return errors.Is(e, core.ErrBackendCrashed) })
	}
	return errors.Join(errs...)
}

// UnitReport is one unit's share of the work.
type UnitReport struct {
	Unit   string
	Import string // how the unit sees the arena: "host pointer", "fd" or "copy"
	Tasks  int64
	Busy   time.Duration
}

// RuntimeReport is what a runtime did so far.
type RuntimeReport struct {
	Units []UnitReport
	Runs  int64
	// Copies and CopyBytes count the transfers between the arena and the units that import
	// nothing (0 when every unit imports it).
	Copies, CopyBytes int64
	ArenaBytes        int64
	// Phases are the requests per phase with the busiest unit's bubble rate (prefill first).
	Phases []PhaseStats
}

// Report describes the runtime's units and counters. It is safe to call at any time.
func (rt *Runtime) Report() RuntimeReport {
	r := RuntimeReport{Runs: rt.runs.Load(), Copies: rt.copies.Load(), CopyBytes: rt.copyBytes.Load(),
		ArenaBytes: rt.arena.Size()}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	r.Phases = rt.phaseStats()
	for i, u := range rt.units {
		w := rt.workers[i]
		r.Units = append(r.Units, UnitReport{Unit: u.Name(), Import: rt.mem[i].mode.String(), Tasks: w.ran.Load(),
			Busy: time.Duration(w.busy.Load())})
	}
	return r
}

// String prints one line per unit.
func (r RuntimeReport) String() string {
	var b strings.Builder
	for _, u := range r.Units {
		fmt.Fprintf(&b, "  %-28s arena by %-12s %6d tasks, busy %8.1f ms\n", u.Unit, u.Import, u.Tasks,
			float64(u.Busy)/float64(time.Millisecond))
	}
	fmt.Fprintf(&b, "  %d runs; %d copies (%d bytes) between the arena and units that cannot import it", r.Runs,
		r.Copies, r.CopyBytes)
	return b.String()
}
