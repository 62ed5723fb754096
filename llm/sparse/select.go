package sparse

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/xpuhub/xpu/core"
)

// Select implements host.FFN. The returned wait stays valid until the next Select.
func (r *Runtime) Select(ctx context.Context, l int, h, logits, next []float32, now, later []int32) (func() error, error) {
	t0 := time.Now()
	F, D := r.F, r.D
	switch {
	case r.closed || !r.loaded:
		return nil, fmt.Errorf("sparse: Select before Load or after Close: %w", core.ErrInvalidArgument)
	case l < 0 || l >= r.L:
		return nil, fmt.Errorf("sparse: layer %d of %d: %w", l, r.L, core.ErrInvalidArgument)
	case len(h) == 0 || len(h)%D != 0 || len(now) != F || len(later) != F:
		return nil, fmt.Errorf("sparse: Select with %d values of h (dim %d), %d/%d index slots (%d neurons): %w",
			len(h), D, len(now), len(later), F, core.ErrInvalidArgument)
	case logits != nil && len(logits) != len(h)/D*F, next != nil && len(next) != len(h)/D*F:
		return nil, fmt.Errorf("sparse: %d logits (%d of the next layer) for %d tokens of %d neurons: %w", len(logits), len(next), len(h)/D, F, core.ErrInvalidArgument)
	}
	r.settle(l)
	if r.reqErr != nil {
		r.cfg.log.Debug("sparse: the last Select's reads failed and nobody waited for them", "err", r.reqErr)
		r.reqErr = nil
	}
	compute := time.Duration(0)
	if !r.lastRet.IsZero() {
		compute = t0.Sub(r.lastRet)
	}
	if r.host != nil {
		logits = nil // a host predictor decides from h alone
	}
	r.epoch++
	if r.epoch == 0 { // wrapped: marks of 2³² selections ago would read as current
		clear(r.mark)
		r.epoch = 1
	}
	sample := r.cfg.recallEvery > 0 && r.selects%int64(r.cfg.recallEvery) == 0
	r.selects++
	var sampling time.Duration
	var tp, npred, ntrue int64
	c := len(h) / D
	active := r.active[:0]
	for t := range c {
		x := h[t*D : (t+1)*D]
		if logits != nil {
			for i, v := range logits[t*F : (t+1)*F] {
				if v > r.threshold {
					if r.mark[i] != r.epoch {
						r.mark[i] = r.epoch
						active = append(active, int32(i))
					}
					if sample {
						r.predMark[i] = true
					}
				}
			}
		} else {
			if r.host != nil {
				r.predBuf = r.host.Predict(l, x, r.predBuf[:0])
			} else {
				r.predBuf = r.hostTrained().Predict(l, x, r.predBuf[:0])
			}
			for _, i := range r.predBuf {
				if i < 0 || int(i) >= F {
					r.active = active
					if sample {
						clear(r.predMark)
					}
					return nil, fmt.Errorf("sparse: predictor gave neuron %d of layer %d (%d neurons): %w", i, l, F, core.ErrInvalidArgument)
				}
				if r.mark[i] != r.epoch {
					r.mark[i] = r.epoch
					active = append(active, i)
				}
				if sample {
					r.predMark[i] = true
				}
			}
		}
		if sample {
			ts := time.Now()
			a, b, d := r.measure(l, x)
			tp, npred, ntrue = tp+a, npred+b, ntrue+d
			sampling += time.Since(ts)
		}
	}
	r.active = active
	slices.Sort(active)

	// Hot rows and hits first, pinning the hit slots so no miss evicts them.
	// A hit whose prefetch is still in flight goes to later.
	hot := int32(r.split.Hot[l])
	nNow, nHot, nLater, pfUsed, pfLate := 0, 0, 0, 0, 0
	misses := r.missRow[:0]
	hits := r.hits[:0]
	base := int32(l * F)
	for _, i := range active {
		if i < hot {
			now[nNow] = int32(r.hotBase[l]) + i
			nNow++
			nHot++
			continue
		}
		if s := r.where[base+i]; s >= 0 {
			if r.slotPf[s] {
				r.slotPf[s] = false
				pfUsed++
			}
			if r.slotSeq[s] <= r.completed {
				now[nNow] = int32(r.coldBase) + s
				nNow++
			} else {
				later[nLater] = int32(r.coldBase) + s
				nLater++
				pfLate++
			}
			r.ev.remove(s)
			hits = append(hits, s)
			continue
		}
		misses = append(misses, i)
	}
	// A bounded budget's cold slots may not hold the whole selection: the least frequent of its
	// misses (the highest bundle rows) are dropped.
	dropped := 0
	if room := len(r.slotKey) - len(hits); len(misses) > room {
		dropped = len(misses) - room
		misses = misses[:room]
	}
	req := &r.reqs[(r.issued+1)%int64(len(r.reqs))]
	rows := req.rows[:0]
	for _, i := range misses {
		var s int32
		if n := len(r.free); n > 0 {
			s, r.free = r.free[n-1], r.free[:n-1]
		} else if s = r.ev.victim(); s < 0 {
			// splitBudget sizes the slots for any one layer's selection: unreachable. Undo
			// the assignments so no slot claims a neuron it does not hold.
			for _, hs := range hits {
				r.ev.push(hs, true)
			}
			for _, rw := range rows {
				s := int32(uint32(rw))
				r.where[r.slotKey[s]], r.slotKey[s] = -1, -1
				r.free = append(r.free, s)
			}
			req.rows = rows[:0]
			return nil, fmt.Errorf("sparse: layer %d: no cold slot left for %d misses: %w", l, len(misses), core.ErrInternal)
		}
		if old := r.slotKey[s]; old >= 0 {
			r.where[old] = -1
		}
		r.slotKey[s], r.where[base+i] = base+i, s
		r.slotSeq[s], r.slotPf[s] = r.issued+1, false
		later[nLater] = int32(r.coldBase) + s
		nLater++
		rows = append(rows, uint64(i)<<32|uint64(s))
	}
	req.rows = rows
	if len(rows) > 0 {
		// Reads start now, while the runner computes now's rows.
		r.queue(ctx, req, l, false)
	}
	r.needSeq = r.issued
	// The look-ahead, before this selection's slots go back to the evictor (so it cannot take
	// them).
	var sp time.Duration
	pfRows := 0
	if r.pfLog != nil && c == 1 && l+1 < r.L {
		ts := time.Now()
		pfRows = r.prefetch(ctx, l+1, h, next)
		sp = time.Since(ts)
	}
	for _, s := range hits {
		r.ev.push(s, true)
	}
	for _, rw := range rows {
		r.ev.push(int32(uint32(rw)), false)
	}
	r.hits, r.missRow = hits, misses
	for k := nNow; k < F; k++ {
		now[k] = -1
	}
	for k := nLater; k < F; k++ {
		later[k] = -1
	}
	end := time.Now()
	r.mu.Lock()
	st := &r.st
	if l == 0 {
		st.Tokens += int64(c)
	}
	st.Selects++
	st.Selected += int64(len(active))
	st.HotRows += int64(nHot)
	st.ColdHits += int64(len(hits))
	st.ColdMisses += int64(len(rows))
	st.Dropped += int64(dropped)
	st.Predict += end.Sub(t0) - sampling - sp
	st.PrefetchPredict += sp
	st.PrefetchRows += int64(pfRows)
	st.PrefetchUsed += int64(pfUsed)
	st.PrefetchLate += int64(pfLate)
	st.Sampling += sampling
	st.Compute += compute
	if sample {
		st.RecallSamples += int64(c)
		st.truePos += tp
		st.predicted += npred
		st.active += ntrue
	}
	r.mu.Unlock()
	r.lastRet = end
	return r.waitFn, nil
}

// measure compares the predicted neurons of one token (predMark, cleared here) with its truly
// active ones: gate row · x > 0, each gate row decoded from the mapped sidecar on its own.
func (r *Runtime) measure(l int, x []float32) (tp, pred, truth int64) {
	b := r.sc.Bundle(l)
	seg := r.sc.BundleType.Bytes(int64(r.D))
	for i := 0; i < r.F; i++ {
		g := r.gateRow
		raw := b[int64(i)*r.rowBytes:][:seg]
		switch r.sc.BundleType {
		case core.F32:
			g = core.DecodeF32To(g, raw)
		case core.F16:
			for j := range g {
				g[j] = core.F16ToF32(binary.LittleEndian.Uint16(raw[2*j:]))
			}
		default:
			if xs, err := core.Dequantize(r.sc.BundleType, raw, 0); err == nil {
				g = xs
			}
		}
		on := dot(g, x) > 0
		p := r.predMark[i]
		r.predMark[i] = false
		switch {
		case on && p:
			tp, pred, truth = tp+1, pred+1, truth+1
		case on:
			truth++
		case p:
			pred++
		}
	}
	return tp, pred, truth
}

// queue sends req (rows sorted by file offset, slots already assigned) to the I/O worker.
func (r *Runtime) queue(ctx context.Context, req *ioReq, l int, prefetch bool) {
	r.issued++
	req.ctx, req.layer, req.seq, req.prefetch = ctx, l, r.issued, prefetch
	r.inflight = append(r.inflight, req)
	r.w.reqs <- req
}

// hostTrained is the sidecar's predictor decoded for the host, made on first use: the runner
// computes the logits in its graphs, so most runtimes never need it.
func (r *Runtime) hostTrained() *Trained {
	if r.trained == nil {
		r.trained = r.sc.Predictor()
		r.trained.Threshold = r.threshold
	}
	return r.trained
}

// prefetch predicts layer l's neurons from x (the previous layer's FFN input), or takes the
// runner's logits of that prediction (next), and queues the reads of those neither hot nor
// cached, into free slots or the evictor's victims (the selection in progress is out of its
// reach). It returns the rows queued.
func (r *Runtime) prefetch(ctx context.Context, l int, x, next []float32) int {
	lg := next
	if lg == nil {
		r.pfLog = r.hostTrained().Logits(l, x, r.pfLog)
		lg = r.pfLog
	}
	hot := r.split.Hot[l]
	base := int32(l * r.F)
	req := &r.reqs[(r.issued+1)%int64(len(r.reqs))]
	rows := req.rows[:0]
	for i, v := range lg {
		if v <= r.threshold || i < hot || r.where[base+int32(i)] >= 0 {
			continue
		}
		var s int32
		if n := len(r.free); n > 0 {
			s, r.free = r.free[n-1], r.free[:n-1]
		} else if s = r.ev.victim(); s < 0 {
			break
		}
		if old := r.slotKey[s]; old >= 0 {
			r.where[old] = -1
		}
		r.slotKey[s], r.where[base+int32(i)] = base+int32(i), s
		r.slotSeq[s], r.slotPf[s] = r.issued+1, true
		rows = append(rows, uint64(i)<<32|uint64(uint32(s)))
	}
	req.rows = rows
	if len(rows) > 0 {
		r.queue(ctx, req, l, true)
	}
	for _, rw := range rows {
		r.ev.push(int32(uint32(rw)), false)
	}
	return len(rows)
}

// complete takes the oldest request's result (blocking until the worker sends it); a failed
// request leaves its slots empty (their bytes are not the neurons they were meant to hold),
// but for those a later request took over.
func (r *Runtime) complete() {
	err := <-r.w.done
	req := r.inflight[0]
	r.inflight = append(r.inflight[:0], r.inflight[1:]...)
	r.completed = req.seq
	if err == nil {
		return
	}
	for _, rw := range req.rows {
		s := int32(uint32(rw))
		if r.slotSeq[s] != req.seq {
			continue
		}
		if k := r.slotKey[s]; k >= 0 {
			r.where[k] = -1
		}
		r.slotKey[s], r.slotPf[s] = -1, false
		r.ev.remove(s)
		r.free = append(r.free, s)
	}
	r.reqErr = errors.Join(r.reqErr, err)
}

// drain completes every request in flight.
func (r *Runtime) drain() {
	for len(r.inflight) > 0 {
		r.complete()
	}
}

// settle, at the start of layer l's Select, completes every request in flight but a prefetch
// of layer l (which Select lists as later where it is still loading), then takes whatever the
// worker has finished since.
func (r *Runtime) settle(l int) {
	for n := len(r.inflight); n > 0; n = len(r.inflight) {
		if q := r.inflight[n-1]; n == 1 && q.prefetch && q.layer == l {
			break
		}
		r.complete()
	}
	for len(r.inflight) > 0 && len(r.w.done) > 0 {
		r.complete()
	}
}

// wait is what Select returns: it blocks until the last Select's lists are in the cache (its
// misses, and the prefetched rows it found still loading; not the next layer's prefetch).
func (r *Runtime) wait() error {
	t0 := time.Now()
	for r.completed < r.needSeq {
		r.complete()
	}
	end := time.Now()
	r.mu.Lock()
	if !r.lastRet.IsZero() {
		r.st.Compute += t0.Sub(r.lastRet)
	}
	r.st.IOWait += end.Sub(t0)
	r.mu.Unlock()
	r.lastRet = end
	err := r.reqErr
	r.reqErr = nil
	return err
}
