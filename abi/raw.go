package abi

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/xpuhub/xpu/core"
)

// The raw API: one method per function-table entry, taking and returning handles and Go values,
// with the plugin's status as the plugin gave it. It does no checking of its own beyond what
// keeps the host's memory safe, so that the conformance suite can probe how a plugin answers
// misuse (stale handles, bad sizes, wrong lifecycle order). An entry the plugin's table lacks
// answers StatusUnsupported without calling anything.

// FencePoint is xpu_fence_point: a fence handle and a timeline value.
type FencePoint struct {
	Fence uint64
	Value uint64
}

// RawVerdict is one xpu_node_verdict as the plugin wrote it.
type RawVerdict struct {
	Verdict   core.Verdict
	Precision core.Precision
	Reason    string
}

// HasEntry reports whether the plugin's table has the named entry (see EntryNames).
func (p *Plugin) HasEntry(name string) bool {
	for i, n := range entryNames {
		if n == name {
			return i < p.n && p.entries()[i] != 0
		}
	}
	return false
}

// EntryNames lists the function-table entries this host knows, in table order.
func EntryNames() []string { return append([]string(nil), entryNames...) }

// call runs one plugin call. Missing entries answer UNSUPPORTED, a shut-down plugin answers
// BAD_STATE (its table must not be called any more), and a panic at the purego boundary
// becomes INTERNAL so that no panic crosses the API.
func (p *Plugin) call(entry string, present bool, f func() int32) (st Status) {
	if st, ok := p.callable(present); !ok {
		return st
	}
	enterCall(p.probe.Name, entry)
	defer leaveCall()
	defer p.recoverInto(&st, entry)
	return Status(f())
}

// callDirect is call for an entry taking up to four integer arguments, through
// purego.SyscallN on the entry's address (fn; 0: missing), with no allocation: the per-task
// calls of a scheduler. Arguments past the entry's own are passed and ignored, as the C
// calling convention allows.
func (p *Plugin) callDirect(site *callSite, fn uintptr, a, b, c, d uintptr) (st Status) {
	if st, ok := p.callable(fn != 0); !ok {
		return st
	}
	enterSite(site)
	defer leaveCall()
	defer p.recoverInto(&st, site.entry)
	r1, _, _ := purego.SyscallN(fn, a, b, c, d)
	return Status(int32(uint32(r1)))
}

// callable is the status a call answers without calling (false): UNSUPPORTED for a missing
// entry, BAD_STATE once the plugin is shut down.
func (p *Plugin) callable(present bool) (Status, bool) {
	switch {
	case !present:
		return StatusUnsupported, false
	case p.isShutdown():
		return StatusBadState, false
	}
	return StatusOK, true
}

// recoverInto, deferred by a call, turns a panic at the purego boundary into INTERNAL.
func (p *Plugin) recoverInto(st *Status, entry string) {
	if r := recover(); r != nil {
		slog.Error("abi: panic in plugin call", "plugin", p.probe.Name, "entry", entry, "panic", r)
		*st = StatusInternal
	}
}

func (p *Plugin) isShutdown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down
}

func bytePtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(unsafe.SliceData(b))
}

// LastError returns last_error(h): the message of the last failure on handle h (0 = the
// plugin as a whole). Messages longer than 4 KiB are truncated.
func (p *Plugin) LastError(h uint64) string {
	if p.fn.lastError == nil || p.isShutdown() {
		return ""
	}
	var msg string
	p.call("last_error", true, func() int32 {
		msg = lastErrorWith(p.fn.lastError, h)
		return 0
	})
	return msg
}

// Shutdown calls shutdown. Every later call of the raw API answers StatusBadState. Close is
// the normal way; this is for the conformance suite's lifecycle tests.
func (p *Plugin) Shutdown() Status {
	st := p.call("shutdown", p.fn.shutdown != nil, func() int32 { return p.fn.shutdown() })
	p.mu.Lock()
	p.down = true
	p.mu.Unlock()
	return st
}

// GetInfo calls get_info.
func (p *Plugin) GetInfo() (PluginInfo, Status) {
	info, err := p.getInfo()
	if err != nil {
		if se := (*StatusError)(nil); errors.As(err, &se) {
			return info, se.Status
		}
		return info, StatusInternal
	}
	return info, StatusOK
}

// DeviceCount calls device_count.
func (p *Plugin) DeviceCount() (uint32, Status) {
	var n uint32
	st := p.call("device_count", p.fn.deviceCount != nil, func() int32 { return p.fn.deviceCount(&n) })
	return n, st
}

// DeviceInfo calls device_info. Backend and Index are filled in from the plugin name and dev.
func (p *Plugin) DeviceInfo(dev uint32) (core.DeviceInfo, Status) {
	var out cDeviceInfo
	out.StructSize = uint32(unsafe.Sizeof(out))
	st := p.call("device_info", p.fn.deviceInfo != nil, func() int32 { return p.fn.deviceInfo(dev, &out) })
	if st != StatusOK {
		return core.DeviceInfo{}, st
	}
	return core.DeviceInfo{
		Backend: p.probe.Name, Index: int(dev), Kind: core.DeviceKind(out.Kind),
		Caps: core.Caps(out.Caps), Name: goString(out.Name[:]), Vendor: goString(out.Vendor[:]),
		Driver: goString(out.DriverVersion[:]), MemoryBytes: out.MemoryBytes,
		ComputeUnits: int(out.ComputeUnits),
		Peaks: core.Peaks{ReadBytesPerSec: out.PeakReadBytesPerSec, FLOPSF32: out.PeakFLOPSF32,
			FLOPSF16: out.PeakFLOPSF16, OPSInt8: out.PeakOPSInt8},
	}, st
}

// OpSupport calls op_support.
func (p *Plugin) OpSupport(dev uint32, q core.OpQuery) (core.Verdict, Status) {
	cq := cOpQuery{Op: uint32(q.Op), DTypeIn: uint32(q.DTypeIn), DTypeWeight: uint32(q.DTypeWeight),
		DTypeOut: uint32(q.DTypeOut), Rank: uint32(q.Rank)}
	cq.StructSize = uint32(unsafe.Sizeof(cq))
	var v uint32
	st := p.call("op_support", p.fn.opSupport != nil, func() int32 { return p.fn.opSupport(dev, &cq, &v) })
	return core.Verdict(v), st
}

// ContextCreate calls context_create; opts "" passes NULL.
func (p *Plugin) ContextCreate(dev uint32, opts string) (uint64, Status) {
	var h uint64
	o := cString(opts)
	st := p.call("context_create", p.fn.ctxCreate != nil, func() int32 { return p.fn.ctxCreate(dev, o, &h) })
	return h, st
}

// ContextRelease calls context_release.
func (p *Plugin) ContextRelease(ctx uint64) Status {
	return p.call("context_release", p.fn.ctxRelease != nil, func() int32 { return p.fn.ctxRelease(ctx) })
}

// BufferAlloc calls buffer_alloc.
func (p *Plugin) BufferAlloc(ctx, size uint64, kind uint32) (uint64, Status) {
	var h uint64
	st := p.call("buffer_alloc", p.fn.bufAlloc != nil, func() int32 { return p.fn.bufAlloc(ctx, size, kind, &h) })
	return h, st
}

// BufferImportHost calls buffer_import with XPU_IMPORT_HOST over mem. The caller keeps mem
// alive and unmoved for as long as the buffer lives.
func (p *Plugin) BufferImportHost(ctx uint64, mem []byte) (uint64, Status) {
	d := cImportDesc{Kind: 1, HostPtr: bytePtr(mem), FD: -1, Size: uint64(len(mem))}
	d.StructSize = uint32(unsafe.Sizeof(d))
	var h uint64
	st := p.call("buffer_import", p.fn.bufImport != nil, func() int32 { return p.fn.bufImport(ctx, &d, &h) })
	return h, st
}

// BufferImportFD calls buffer_import with XPU_IMPORT_FD.
func (p *Plugin) BufferImportFD(ctx uint64, fd int, offset, size uint64) (uint64, Status) {
	d := cImportDesc{Kind: 2, FD: int64(fd), Offset: offset, Size: size}
	d.StructSize = uint32(unsafe.Sizeof(d))
	var h uint64
	st := p.call("buffer_import", p.fn.bufImport != nil, func() int32 { return p.fn.bufImport(ctx, &d, &h) })
	return h, st
}

// BufferMap calls buffer_map and views the mapping as buffer_size bytes. The slice is valid
// until BufferUnmap or BufferRelease.
func (p *Plugin) BufferMap(buf uint64) ([]byte, Status) {
	size, st := p.BufferSize(buf)
	if st != StatusOK {
		return nil, st
	}
	var ptr unsafe.Pointer
	st = p.call("buffer_map", p.fn.bufMap != nil, func() int32 { return p.fn.bufMap(buf, &ptr) })
	if st != StatusOK {
		return nil, st
	}
	if ptr == nil {
		if size == 0 {
			return []byte{}, StatusOK
		}
		return nil, StatusInternal
	}
	return unsafe.Slice((*byte)(ptr), size), StatusOK
}

// BufferUnmap calls buffer_unmap.
func (p *Plugin) BufferUnmap(buf uint64) Status {
	return p.call("buffer_unmap", p.fn.bufUnmap != nil, func() int32 { return p.fn.bufUnmap(buf) })
}

// BufferWrite calls buffer_write with src's bytes at offset.
func (p *Plugin) BufferWrite(buf, offset uint64, src []byte) Status {
	return p.call("buffer_write", p.fn.bufWrite != nil, func() int32 {
		return p.fn.bufWrite(buf, offset, bytePtr(src), uint64(len(src)))
	})
}

// BufferRead calls buffer_read into dst from offset.
func (p *Plugin) BufferRead(buf, offset uint64, dst []byte) Status {
	return p.call("buffer_read", p.fn.bufRead != nil, func() int32 {
		return p.fn.bufRead(buf, offset, bytePtr(dst), uint64(len(dst)))
	})
}

// BufferSize calls buffer_size.
func (p *Plugin) BufferSize(buf uint64) (uint64, Status) {
	var n uint64
	st := p.call("buffer_size", p.fn.bufSize != nil, func() int32 { return p.fn.bufSize(buf, &n) })
	return n, st
}

// BufferRelease calls buffer_release.
func (p *Plugin) BufferRelease(buf uint64) Status {
	return p.call("buffer_release", p.fn.bufRelease != nil, func() int32 { return p.fn.bufRelease(buf) })
}

// GraphAnalyze calls graph_analyze with room for cap verdicts and returns them all (entries
// the plugin did not fill read as verdict NO with an empty reason).
func (p *Plugin) GraphAnalyze(ctx uint64, ir []byte, cap uint32) ([]RawVerdict, Status) {
	out := make([]cNodeVerdict, cap)
	for i := range out {
		out[i].StructSize = uint32(unsafe.Sizeof(out[i]))
	}
	var first *cNodeVerdict
	if cap > 0 {
		first = &out[0]
	}
	st := p.call("graph_analyze", p.fn.analyze != nil, func() int32 {
		return p.fn.analyze(ctx, bytePtr(ir), uint64(len(ir)), first, cap)
	})
	if st != StatusOK {
		return nil, st
	}
	vs := make([]RawVerdict, cap)
	for i, v := range out {
		vs[i] = RawVerdict{Verdict: core.Verdict(v.Verdict), Precision: core.Precision(v.Precision),
			Reason: goString(v.Reason[:])}
	}
	return vs, st
}

// GraphPrepare calls graph_prepare; opts "" and an empty cache pass NULL.
func (p *Plugin) GraphPrepare(ctx uint64, ir []byte, opts string, cache []byte) (uint64, Status) {
	d := cPrepareDesc{IR: bytePtr(ir), IRSize: uint64(len(ir)), Options: cString(opts),
		Cache: bytePtr(cache), CacheSize: uint64(len(cache))}
	d.StructSize = uint32(unsafe.Sizeof(d))
	var h uint64
	st := p.call("graph_prepare", p.fn.prepare != nil, func() int32 { return p.fn.prepare(ctx, &d, &h) })
	return h, st
}

// ExecutableSerialize calls executable_serialize twice: for the size, then for the bytes.
func (p *Plugin) ExecutableSerialize(exe uint64) ([]byte, Status) {
	var n uint64
	st := p.call("executable_serialize", p.fn.serialize != nil, func() int32 {
		return p.fn.serialize(exe, nil, 0, &n)
	})
	if st != StatusOK {
		return nil, st
	}
	if n > 1<<34 {
		return nil, StatusOutOfMemory
	}
	blob := make([]byte, n)
	var got uint64
	st = p.call("executable_serialize", true, func() int32 {
		return p.fn.serialize(exe, bytePtr(blob), n, &got)
	})
	if st != StatusOK {
		return nil, st
	}
	if got > n {
		return nil, StatusInternal
	}
	return blob[:got], st
}

// ExecutableRelease calls executable_release.
func (p *Plugin) ExecutableRelease(exe uint64) Status {
	return p.call("executable_release", p.fn.exeRelease != nil, func() int32 { return p.fn.exeRelease(exe) })
}

// ExecutionCreate calls execution_create.
func (p *Plugin) ExecutionCreate(exe uint64) (uint64, Status) {
	var h uint64
	st := p.call("execution_create", p.fn.exCreate != nil, func() int32 { return p.fn.exCreate(exe, &h) })
	return h, st
}

// ExecutionBind calls execution_bind.
func (p *Plugin) ExecutionBind(ex uint64, io uint32, buf, offset uint64) Status {
	return p.callDirect(&p.siteBind, p.fn.exBindPtr, uintptr(ex), uintptr(io), uintptr(buf), uintptr(offset))
}

// ExecutionSubmit calls execution_submit; signal nil passes NULL.
func (p *Plugin) ExecutionSubmit(ex uint64, waits []FencePoint, signal *FencePoint) Status {
	cw := make([]cFencePoint, len(waits))
	for i, w := range waits {
		cw[i] = cFencePoint(w)
	}
	var wp, sp *cFencePoint
	if len(cw) > 0 {
		wp = &cw[0]
	}
	if signal != nil {
		s := cFencePoint(*signal)
		sp = &s
	}
	return p.call("execution_submit", p.fn.exSubmit != nil, func() int32 {
		return p.fn.exSubmit(ex, wp, uint32(len(cw)), sp)
	})
}

// ExecutionRun calls execution_run.
func (p *Plugin) ExecutionRun(ex uint64) Status {
	return p.callDirect(&p.siteRun, p.fn.exRunPtr, uintptr(ex), 0, 0, 0)
}

// ExecutionRelease calls execution_release.
func (p *Plugin) ExecutionRelease(ex uint64) Status {
	return p.call("execution_release", p.fn.exRelease != nil, func() int32 { return p.fn.exRelease(ex) })
}

// FenceCreate calls fence_create.
func (p *Plugin) FenceCreate(ctx, initial uint64) (uint64, Status) {
	var h uint64
	st := p.call("fence_create", p.fn.fenceCreate != nil, func() int32 { return p.fn.fenceCreate(ctx, initial, &h) })
	return h, st
}

// FenceWait calls fence_wait; a negative timeout waits forever.
func (p *Plugin) FenceWait(f, value uint64, timeout time.Duration) Status {
	ns := int64(timeout)
	if timeout < 0 {
		ns = -1
	}
	return p.call("fence_wait", p.fn.fenceWait != nil, func() int32 { return p.fn.fenceWait(f, value, ns) })
}

// FenceValue calls fence_value.
func (p *Plugin) FenceValue(f uint64) (uint64, Status) {
	var v uint64
	st := p.call("fence_value", p.fn.fenceValue != nil, func() int32 { return p.fn.fenceValue(f, &v) })
	return v, st
}

// FenceSignal calls fence_signal.
func (p *Plugin) FenceSignal(f, value uint64) Status {
	return p.call("fence_signal", p.fn.fenceSignal != nil, func() int32 { return p.fn.fenceSignal(f, value) })
}

// FenceRelease calls fence_release.
func (p *Plugin) FenceRelease(f uint64) Status {
	return p.call("fence_release", p.fn.fenceRelease != nil, func() int32 { return p.fn.fenceRelease(f) })
}

// Err is st.Err with the last_error text of handle h: the one-liner for turning a raw call's
// status into a Go error.
func (p *Plugin) Err(op string, h uint64, st Status) error {
	if st == StatusOK {
		return nil
	}
	return fmt.Errorf("%s %s: %w", p.probe.Name, op, st.Err(p.LastError(h)))
}
