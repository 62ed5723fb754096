package abi

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"time"

	"github.com/xpuhub/xpu/core"
)

// irView is what the validation layer reads of an IR blob: the bytes of each io and where the
// constants lie.
type irView struct {
	ios    []uint64 // inputs first
	nIn    int
	consts []irConst
}

type irConst struct {
	tensor uint32
	buf    uint64
	off    uint64
	bytes  uint64
}

// readIR reads the header, tensor table and io lists of an IR blob (layout in xpu_ir.h). A
// blob it cannot read is left to the plugin, whose answer to bad IR the conformance suite
// checks: ok is false then.
func readIR(ir []byte) (view irView, ok bool) {
	le := binary.LittleEndian
	if len(ir) < irHeaderSize || le.Uint32(ir[0:]) != IRMagic {
		return view, false
	}
	nT, nN := uint64(le.Uint32(ir[12:])), uint64(le.Uint32(ir[16:]))
	nIn, nOut := uint64(le.Uint32(ir[20:])), uint64(le.Uint32(ir[24:]))
	ioOff := uint64(irHeaderSize) + nT*irTensorSize + nN*irNodeSize
	if nT > 1<<24 || nN > 1<<24 || nIn+nOut > 1<<16 || ioOff+4*(nIn+nOut) > uint64(len(ir)) {
		return view, false
	}
	bytesOf := func(t uint64) (uint64, bool) {
		if t >= nT {
			return 0, false
		}
		r := ir[irHeaderSize+t*irTensorSize:]
		dt, rank := core.DType(le.Uint32(r[0:])), le.Uint32(r[4:])
		if !dt.Valid() || rank > core.MaxRank {
			return 0, false
		}
		n := int64(1)
		for d := range core.MaxRank {
			dim := int64(le.Uint64(r[8+8*d:]))
			if dim < 0 || dim > 1<<40 || (dim > 0 && n > math.MaxInt64/dim) {
				return 0, false
			}
			n *= dim
		}
		return uint64(dt.Bytes(n)), true
	}
	for t := range nT {
		r := ir[irHeaderSize+t*irTensorSize:]
		if core.TensorKind(le.Uint32(r[40:])) != core.KindConst {
			continue
		}
		n, ok := bytesOf(t)
		if !ok {
			return view, false
		}
		view.consts = append(view.consts, irConst{tensor: uint32(t), buf: le.Uint64(r[48:]), off: le.Uint64(r[56:]), bytes: n})
	}
	for i := range nIn + nOut {
		n, ok := bytesOf(uint64(le.Uint32(ir[ioOff+4*i:])))
		if !ok {
			return view, false
		}
		view.ios = append(view.ios, n)
	}
	view.nIn = int(nIn)
	return view, true
}

// checkConsts checks that every constant lies inside a live buffer of context cx (v.mu held).
func (v *Validator) checkConsts(call string, cx uint64, view irView) error {
	for _, c := range view.consts {
		b, err := v.inBuffer(call, fmt.Sprintf("constant tensor %d", c.tensor), c.buf, c.off, c.bytes)
		if err != nil {
			return err
		}
		if b.ctx != cx {
			return v.violation(call, RuleHandleLifetime, false, "constant tensor %d is in buffer %#x of context %#x, not of context %#x",
				c.tensor, c.buf, b.ctx, cx)
		}
	}
	return nil
}

// GraphAnalyze checks the context and the constants' buffers, then the verdicts: YES or NO,
// known precisions, and the same precisions as an earlier analysis of the same graph.
func (v *Validator) GraphAnalyze(ctx context.Context, cx uint64, ir []byte, n uint32) ([]RawVerdict, error) {
	const call = "graph_analyze"
	view, readable := readIR(ir)
	if err := v.check(func() error {
		if _, err := v.use(call, kContext, cx); err != nil {
			return err
		}
		if readable {
			return v.checkConsts(call, cx, view)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	raw, err := v.inner.GraphAnalyze(ctx, cx, ir, n)
	if err != nil {
		return raw, err
	}
	a := analysis{allYes: true, precs: make([]core.Precision, len(raw))}
	for i, r := range raw {
		switch {
		case r.Verdict != core.VerdictYes && r.Verdict != core.VerdictNo:
			return nil, v.violation(call, RuleAnalyzePrepare, true, "node %d: verdict %d: graph_analyze answers YES or NO", i, r.Verdict)
		case r.Precision > core.PrecInt4:
			return nil, v.violation(call, RulePrecision, true, "node %d: precision %d is no XPU_PREC_* value", i, r.Precision)
		case r.Verdict == core.VerdictNo && a.allYes:
			a.allYes, a.refused = false, fmt.Sprintf("node %d (%s)", i, r.Reason)
		}
		a.precs[i] = r.Precision
	}
	key := analysisKey{ctx: cx, ir: maphash.Bytes(v.seed, ir)}
	return raw, v.check(func() error {
		if old, ok := v.analyses[key]; ok && len(old.precs) == len(a.precs) {
			for i := range a.precs {
				if old.precs[i] != a.precs[i] {
					return v.violation(call, RulePrecision, true, "node %d: precision %s, where an earlier analysis of the same graph said %s",
						i, a.precs[i], old.precs[i])
				}
			}
		}
		v.analyses[key] = a
		return nil
	})
}

// prepareMayFail are the statuses a prepare may answer after its analysis accepted the graph:
// resources, not capability.
var prepareMayFail = []error{core.ErrOutOfMemory, core.ErrDeviceLost, core.ErrTimeout, core.ErrMissingDependency,
	core.ErrBackendCrashed, context.Canceled, context.DeadlineExceeded}

// GraphPrepare checks the context and constants, and that the answer agrees with the graph's
// analysis on this context.
func (v *Validator) GraphPrepare(ctx context.Context, cx uint64, ir []byte, opts string, cache []byte) (uint64, error) {
	const call = "graph_prepare"
	view, readable := readIR(ir)
	var dev uint32
	if err := v.check(func() error {
		c, err := v.use(call, kContext, cx)
		if err != nil {
			return err
		}
		dev = c.dev
		if readable {
			return v.checkConsts(call, cx, view)
		}
		return nil
	}); err != nil {
		return 0, err
	}
	h, err := v.inner.GraphPrepare(ctx, cx, ir, opts, cache)
	v.mu.Lock()
	defer v.mu.Unlock()
	a, analyzed := v.analyses[analysisKey{ctx: cx, ir: maphash.Bytes(v.seed, ir)}]
	if err != nil {
		resource := false
		for _, e := range prepareMayFail {
			resource = resource || errors.Is(err, e)
		}
		if cache != nil && errors.Is(err, core.ErrIncompatible) {
			resource = true // a stale cache blob is refused, not the graph
		}
		if analyzed && a.allYes && !resource {
			return 0, v.violation(call, RuleAnalyzePrepare, true, "failed after graph_analyze accepted every node of the graph: %v", err)
		}
		return h, err
	}
	if analyzed && !a.allYes {
		v.mu.Unlock()
		_ = v.inner.ExecutableRelease(h) // the violation is the error; the executable must not leak
		v.mu.Lock()
		return 0, v.violation(call, RuleAnalyzePrepare, true, "succeeded for a graph graph_analyze refused at %s", a.refused)
	}
	o := &vobj{dev: dev, ctx: cx, ios: view.ios, noIR: !readable}
	if analyzed {
		o.precOK = true
		for i, p := range a.precs {
			if i == 0 || precisionRank(p) > precisionRank(o.prec) {
				o.prec = p
			}
		}
	}
	return h, v.fresh(call, kExecutable, h, o)
}

// notePrepared gives the graph of an executable, for the precision check (the adapter calls
// it after a prepare when its Calls is a Validator).
func (v *Validator) notePrepared(exe uint64, g *core.Graph) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if o, ok := v.objs[vkey{kExecutable, exe}]; ok {
		o.graph = g
	}
}

// ExecutableSerialize checks the handle.
func (v *Validator) ExecutableSerialize(exe uint64) ([]byte, error) {
	if err := v.check(func() error { _, err := v.use("executable_serialize", kExecutable, exe); return err }); err != nil {
		return nil, err
	}
	return v.inner.ExecutableSerialize(exe)
}

// ExecutableRelease checks the handle.
func (v *Validator) ExecutableRelease(exe uint64) error {
	return v.release("executable_release", kExecutable, exe, func() error { return v.inner.ExecutableRelease(exe) })
}

// ExecutionCreate checks the executable and records the execution.
func (v *Validator) ExecutionCreate(exe uint64) (uint64, error) {
	const call = "execution_create"
	var e *vobj
	if err := v.check(func() error {
		var err error
		e, err = v.use(call, kExecutable, exe)
		return err
	}); err != nil {
		return 0, err
	}
	h, err := v.inner.ExecutionCreate(exe)
	if err != nil {
		return h, err
	}
	return h, v.check(func() error {
		return v.fresh(call, kExecution, h, &vobj{dev: e.dev, ctx: e.ctx, exe: exe, exeObj: e, binds: make([]uint64, len(e.ios)),
			offsets: make([]uint64, len(e.ios))})
	})
}

// idle checks that no other thread runs execution ex (v.mu held).
func (v *Validator) idle(call string, ex uint64) (*vobj, error) {
	x, err := v.use(call, kExecution, ex)
	if err != nil {
		return nil, err
	}
	if x.inflight > 0 {
		return nil, v.violation(call, RuleThreading, false, "execution %#x is being run by another thread", ex)
	}
	return x, nil
}

// ExecutionBind checks the handles, the io and that the io's tensor fits the buffer.
func (v *Validator) ExecutionBind(ex uint64, io uint32, buf, offset uint64) error {
	const call = "execution_bind"
	if err := v.check(func() error {
		x, err := v.idle(call, ex)
		if err != nil {
			return err
		}
		if x.exeObj.noIR {
			_, err := v.use(call, kBuffer, buf)
			return err
		}
		if int(io) >= len(x.binds) {
			return v.violation(call, RuleBufferBounds, false, "io %d of an executable with %d ios", io, len(x.binds))
		}
		b, err := v.inBuffer(call, fmt.Sprintf("io %d", io), buf, offset, x.exeObj.ios[io])
		if err != nil {
			return err
		}
		if b.ctx != x.ctx {
			return v.violation(call, RuleHandleLifetime, false, "buffer %#x is of context %#x, the execution of context %#x",
				buf, b.ctx, x.ctx)
		}
		return nil
	}); err != nil {
		return err
	}
	if err := v.inner.ExecutionBind(ex, io, buf, offset); err != nil {
		return err
	}
	return v.check(func() error {
		if x, ok := v.objs[vkey{kExecution, ex}]; ok && int(io) < len(x.binds) {
			x.binds[io], x.offsets[io] = buf, offset
		}
		return nil
	})
}

// boundLive checks that no io of x is bound to a released buffer (v.mu held).
func (v *Validator) boundLive(call string, ex uint64, x *vobj) error {
	for io, b := range x.binds {
		if b == 0 {
			continue
		}
		if o := v.objs[vkey{kBuffer, b}]; o != nil && o.released {
			return v.violation(call, RuleHandleLifetime, false, "use after release: io %d of execution %#x is bound to buffer %#x, released by %s",
				io, ex, b, o.releasedBy)
		}
	}
	return nil
}

// ExecutionSubmit checks the execution, its bindings and the fences: each signal moves its
// timeline forward.
func (v *Validator) ExecutionSubmit(ex uint64, waits []FencePoint, signal *FencePoint) error {
	const call = "execution_submit"
	if err := v.check(func() error {
		x, err := v.idle(call, ex)
		if err != nil {
			return err
		}
		if err := v.boundLive(call, ex, x); err != nil {
			return err
		}
		for _, w := range waits {
			if _, err := v.use(call, kFence, w.Fence); err != nil {
				return err
			}
		}
		if signal != nil {
			f, err := v.use(call, kFence, signal.Fence)
			if err != nil {
				return err
			}
			if signal.Value < f.value {
				return v.violation(call, RuleFenceOrder, false, "signals fence %#x to %d, which already reached %d",
					signal.Fence, signal.Value, f.value)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	return v.inner.ExecutionSubmit(ex, waits, signal)
}

// ExecutionRun checks the execution, its bindings and the threading rule, runs it, and on an
// executable's first run compares its outputs with the reference at the reported precision.
func (v *Validator) ExecutionRun(ctx context.Context, ex uint64, hist *RunHistory) error {
	const call = "execution_run"
	var x, e *vobj
	if err := v.check(func() error {
		var err error
		if x, err = v.idle(call, ex); err != nil {
			return err
		}
		if err := v.boundLive(call, ex, x); err != nil {
			return err
		}
		if int(x.dev) < len(v.devs) && !v.devs[x.dev].Caps.Has(core.CapConcurrent) && v.running[x.dev] > 0 {
			return v.violation(call, RuleThreading, false, "device %d (no XPU_CAP_CONCURRENT) is already running another execution",
				x.dev)
		}
		x.inflight++
		v.running[x.dev]++
		e = x.exeObj
		return nil
	}); err != nil {
		return err
	}
	var pc *precisionCheck
	if v.claimCheck(e) {
		pc = v.readInputs(e, x)
	}
	err := v.inner.ExecutionRun(ctx, ex, hist)
	v.mu.Lock()
	x.inflight--
	v.running[x.dev]--
	v.mu.Unlock()
	if err != nil || pc == nil {
		return err
	}
	return v.comparePrecision(ctx, pc, x)
}

// ExecutionRelease checks the handle and that no other thread runs it.
func (v *Validator) ExecutionRelease(ex uint64) error {
	if err := v.check(func() error { _, err := v.idle("execution_release", ex); return err }); err != nil {
		return err
	}
	return v.release("execution_release", kExecution, ex, func() error { return v.inner.ExecutionRelease(ex) })
}

// FenceCreate checks the context and records the fence at its initial value.
func (v *Validator) FenceCreate(cx, initial uint64) (uint64, error) {
	const call = "fence_create"
	if err := v.check(func() error { _, err := v.use(call, kContext, cx); return err }); err != nil {
		return 0, err
	}
	h, err := v.inner.FenceCreate(cx, initial)
	if err != nil {
		return h, err
	}
	return h, v.check(func() error { return v.fresh(call, kFence, h, &vobj{ctx: cx, value: initial}) })
}

// reached notes that fence f is at least value (v.mu held).
func (v *Validator) reached(f, value uint64) {
	if o := v.objs[vkey{kFence, f}]; o != nil && value > o.value {
		o.value = value
	}
}

// FenceWait checks the handle; a wait that succeeded means the fence reached value.
func (v *Validator) FenceWait(f, value uint64, timeout time.Duration) error {
	if err := v.check(func() error { _, err := v.use("fence_wait", kFence, f); return err }); err != nil {
		return err
	}
	err := v.inner.FenceWait(f, value, timeout)
	if err == nil {
		v.check(func() error { v.reached(f, value); return nil })
	}
	return err
}

// FenceValue checks that the value never goes back.
func (v *Validator) FenceValue(f uint64) (uint64, error) {
	const call = "fence_value"
	if err := v.check(func() error { _, err := v.use(call, kFence, f); return err }); err != nil {
		return 0, err
	}
	val, err := v.inner.FenceValue(f)
	if err != nil {
		return val, err
	}
	return val, v.check(func() error {
		if o := v.objs[vkey{kFence, f}]; o != nil && val < o.value {
			return v.violation(call, RuleFenceOrder, true, "fence %#x answered %d after it had reached %d", f, val, o.value)
		}
		v.reached(f, val)
		return nil
	})
}

// FenceSignal checks that the host's signal moves the timeline forward.
func (v *Validator) FenceSignal(f, value uint64) error {
	const call = "fence_signal"
	if err := v.check(func() error {
		o, err := v.use(call, kFence, f)
		if err != nil {
			return err
		}
		if value < o.value {
			return v.violation(call, RuleFenceOrder, false, "signals fence %#x back to %d from %d", f, value, o.value)
		}
		return nil
	}); err != nil {
		return err
	}
	if err := v.inner.FenceSignal(f, value); err != nil {
		return err
	}
	return v.check(func() error { v.reached(f, value); return nil })
}

// FenceRelease checks the handle.
func (v *Validator) FenceRelease(f uint64) error {
	return v.release("fence_release", kFence, f, func() error { return v.inner.FenceRelease(f) })
}
