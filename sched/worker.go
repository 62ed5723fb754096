package sched

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched/cputopo"
	"github.com/xpuhub/xpu/sched/hostsync"
)

// rtWorker runs one unit's tasks on a goroutine locked to its OS thread.
type rtWorker struct {
	rt     *Runtime
	idx    int
	sig    *hostsync.Signal
	issued uint64 // the highest sequence number handed out (under runMu)
	// cpus is the set the worker's thread is pinned to: its unit's cpus option, when the unit
	// has one and pinning worked (nil: the thread floats). Set before the first job.
	cpus   []int
	pinned chan struct{} // closed once cpus is settled
	jobs   chan *rtJob
	exited chan struct{}

	// the task running now, for other units' predictions
	curPos   atomic.Int64
	curStart atomic.Int64 // unix nanoseconds
	busy     atomic.Int64 // nanoseconds spent running tasks
	ran      atomic.Int64 // tasks run
	stolen   int          // chunks the last stealing task ran here (worker goroutine only)
}

func (w *rtWorker) loop() {
	defer close(w.exited)
	runtime.LockOSThread()
	// a pinned thread is never handed back to the Go scheduler's pool: it ends with the worker
	if !w.pin() {
		defer runtime.UnlockOSThread()
	}
	close(w.pinned)
	for j := range w.jobs {
		// predictions for this job start from its first task (not the last job's position)
		w.curPos.Store(-1)
		w.runJob(j)
		w.curPos.Store(-1)
		j.wg.Done()
	}
}

func (w *rtWorker) runJob(j *rtJob) {
	rt := w.rt
	u := rt.units[w.idx]
	tr := rt.cfg.trace
	for _, t := range j.tasks {
		if j.ctx.Err() != nil {
			return
		}
		for v, seq := range t.waits {
			if seq == 0 || rt.workers[v].sig.Load() >= seq {
				continue
			}
			start := time.Now()
			pred := rt.workers[v].remaining(j, v, seq)
			var err error
			if w.spinsOn(rt.workers[v]) {
				// a wait predicted to outlast the spin blocks at once: the core is then free
				// for whatever else the machine runs, and one wake-up is small beside it
				spin := rt.cfg.pinnedSpin
				if pred > spin {
					spin = 0
				}
				err = rt.workers[v].sig.WaitSpinning(j.ctx, seq, spin)
			} else {
				err = rt.workers[v].sig.Wait(j.ctx, seq, pred)
			}
			if err != nil {
				return // the request was cancelled: its cause is the error
			}
			if tr != nil {
				tr.Slice(u.Name(), "wait "+rt.units[v].Name(), start, time.Now(), map[string]any{
					"on": rt.units[v].Name(), "seq": seq, "predicted_us": pred.Microseconds(), "chunk": t.chunk.Index})
			}
		}
		w.curPos.Store(int64(t.unitPos))
		start := time.Now()
		w.curStart.Store(start.UnixNano())
		if err := w.runTask(j.execCtx, t); err != nil {
			err = fmt.Errorf("%s: %s (chunk %d): %w", u.Name(), t.pp.name, t.chunk.Index, err)
			j.failed.CompareAndSwap(nil, &err)
			j.cancel(err)
			return
		}
		end := time.Now()
		d := end.Sub(start)
		rt.pred.Observe(taskKey{t.p, t.stage, t.part}, d)
		w.busy.Add(int64(d))
		j.busy += d
		w.ran.Add(1)
		w.sig.Publish(t.seq)
		if tr != nil {
			args := map[string]any{"program": t.p.name, "chunk": t.chunk.Index,
				"layer": t.p.stages[t.stage].spec.Layer, "stage": t.p.stages[t.stage].spec.Name, "partition": t.part,
				"nodes": len(t.pp.Nodes), "lane": t.lane}
			switch {
			case t.pp.steal != nil && t.pp.steal.adapt:
				args["cut"] = t.p.cuts.shares[t.cut] // the first unit's share of the rows
			case t.pp.steal != nil:
				args["stolen_chunks"] = w.stolen // of len(t.pp.steal.chunks)
				args["chunks"] = len(t.pp.steal.chunks)
			}
			tr.Slice(u.Name(), t.pp.name, start, end, args)
		}
	}
}

// pin restricts the worker's (locked) thread to its unit's cpus option, so the unit's tasks run
// on the cores the unit was given, where the backend can run them on the calling thread; it
// says whether it did: not without a cpus option, or with one that is not a list of CPUs (the
// backend reports that when the context opens). A failed pin is logged at debug level: the
// thread then floats as before.
func (w *rtWorker) pin() bool {
	list, ok := w.rt.units[w.idx].Spec().Options["cpus"]
	if !ok {
		return false
	}
	cpus, err := cputopo.ParseCPUList(list)
	if err != nil || len(cpus) == 0 {
		return false
	}
	if err := hostsync.PinThread(cpus); err != nil {
		w.rt.cfg.logger.Debug("runtime: worker thread not pinned", "unit", w.rt.units[w.idx].Name(), "err", err)
		return false
	}
	w.cpus = cpus
	return true
}

// DefaultPinnedSpin bounds the spin of a worker waiting for another unit when both are pinned
// to disjoint cores (see Signal.WaitSpinning, WithPinnedSpin): most of a decode step's waits
// are one partition of the other unit (0.05–2 ms); longer ones block, and so does a wait that
// earlier runs predict to be longer (a pipelined prefill's). Blocking instead costs
// a futex wake-up per wait: with 0 the 1B split decode here ran at half the speed.
const DefaultPinnedSpin = 2 * time.Millisecond

// spinsOn says whether this worker may spin on unit v's signal: both threads are pinned and
// share no core, so the spin cannot delay v.
func (w *rtWorker) spinsOn(v *rtWorker) bool {
	if w.cpus == nil || v.cpus == nil {
		return false
	}
	for _, c := range w.cpus {
		if slices.Contains(v.cpus, c) {
			return false
		}
	}
	return true
}

// remaining predicts how long until unit v publishes seq: the rest of the task running there
// plus the tasks queued before the awaited one, from earlier runs' durations.
func (w *rtWorker) remaining(j *rtJob, v int, seq uint64) time.Duration {
	tasks := j.all[v]
	pos := int(w.curPos.Load()) // -1: the unit has not started this job's first task
	var d time.Duration
	for k := max(pos, 0); k < len(tasks) && tasks[k].seq <= seq; k++ {
		key := taskKey{tasks[k].p, tasks[k].stage, tasks[k].part}
		if tasks[k].seq <= w.sig.Load() {
			continue // done
		}
		if k == pos {
			d += w.rt.pred.Remaining(key, time.Unix(0, w.curStart.Load()))
			continue
		}
		if e, ok := w.rt.pred.Predict(key); ok {
			d += e
		}
	}
	return d
}

// runTask binds what moves with the chunk, brings a copying unit's inputs in, runs, and takes
// its outputs out.
func (w *rtWorker) runTask(ctx context.Context, t *rtTask) error {
	if err := w.runPart(ctx, t, t.pp); err != nil {
		return err
	}
	if t.p.check != nil {
		return w.checkOutputs(t)
	}
	return nil
}

// runStolen runs a stealing task's side: chunks from its end of the rows until none are
// left (the other side takes the rest). It returns how many it ran.
func (w *rtWorker) runStolen(ctx context.Context, t *rtTask, st *progSteal) (int, error) {
	if st.adapt {
		start := time.Now()
		err := w.runPart(ctx, t, st.chunks[t.cut])
		t.p.cuts.observe(st.side, time.Since(start))
		return 1, err
	}
	ran := 0
	for {
		i := st.state.claim(t.lane, t.epoch, st.side)
		if i < 0 {
			return ran, nil
		}
		if err := w.runPart(ctx, t, st.chunks[i]); err != nil {
			return ran, err
		}
		ran++
	}
}

// runPart runs partition pp for task t (t.pp, or a chunk of it).
func (w *rtWorker) runPart(ctx context.Context, t *rtTask, pp *progPart) error {
	if pp.steal != nil {
		n, err := w.runStolen(ctx, t, pp.steal)
		w.stolen = n
		return err
	}
	rt := w.rt
	e := pp.execs[t.lane]
	m := rt.mem[pp.unit]
	u := rt.units[pp.unit]
	for k, io := range pp.io {
		if io.stride == 0 {
			continue
		}
		s := io.lanes[t.lane]
		buf, err := m.buffer(rt.arena, u, s.block)
		if err != nil {
			return err
		}
		row, err := t.chunk.rowOf(io)
		if err != nil {
			return err
		}
		off := s.Off + row*io.stride + io.off
		if off < s.Off || off+io.size > s.Off+s.Size {
			return fmt.Errorf("%s at row %d lies outside its span: %w", io.t.Name, row, core.ErrInvalidArgument)
		}
		if err := e.Bind(k, buf, off); err != nil {
			return fmt.Errorf("bind %s: %w", io.t.Name, err)
		}
	}
	if m.mode == importCopy {
		if err := w.copyIO(t, pp, true); err != nil {
			return err
		}
	}
	if err := e.Run(ctx); err != nil {
		return err
	}
	if m.mode == importCopy {
		if err := w.copyIO(t, pp, false); err != nil {
			return err
		}
	}
	return nil
}

// checkOutputs hands the task's floating-point outputs, as the arena holds them, to the
// program's Check.
func (w *rtWorker) checkOutputs(t *rtTask) error {
	for _, io := range t.pp.io {
		if io.isInput || (io.t.DType != core.F32 && io.t.DType != core.F16) {
			continue
		}
		s := io.lanes[t.lane]
		view := w.rt.arena.Bytes(s)
		row, err := t.chunk.rowOf(io)
		if err != nil {
			return err
		}
		off := row*io.stride + io.off
		if off < 0 || off+io.size > int64(len(view)) {
			return fmt.Errorf("%s at row %d lies outside its span: %w", io.t.Name, row, core.ErrInvalidArgument)
		}
		if err := t.p.check(t.stage, io.t, view[off:off+io.size]); err != nil {
			return err
		}
	}
	return nil
}

// copyIO moves a copying unit's partition inputs from the arena to its mirror (in) or its
// outputs back (out), counting the bytes.
func (w *rtWorker) copyIO(t *rtTask, pp *progPart, in bool) error {
	rt := w.rt
	u := rt.units[pp.unit]
	start := time.Now()
	var n int64
	for _, io := range pp.io {
		if io.isInput != in {
			continue
		}
		s := io.lanes[t.lane]
		row, err := t.chunk.rowOf(io)
		if err != nil {
			return err
		}
		off := s.Off + row*io.stride + io.off
		buf, err := rt.mem[pp.unit].buffer(rt.arena, u, s.block)
		if err != nil {
			return err
		}
		b, err := rt.arena.block(s.block)
		if err != nil {
			return err
		}
		host := b.mem[off : off+io.size]
		if in {
			err = buf.Write(off, host)
		} else {
			err = buf.Read(off, host)
		}
		if err != nil {
			return fmt.Errorf("copy %s: %w", io.t.Name, err)
		}
		n += io.size
		rt.copies.Add(1)
	}
	rt.copyBytes.Add(n)
	dir := "copy out"
	if in {
		dir = "copy in"
	}
	rt.cfg.trace.Slice(u.Name(), dir, start, time.Now(), map[string]any{"bytes": n, "chunk": t.chunk.Index})
	return nil
}
