package abi

import (
	"slices"
	"unsafe"

	"github.com/ebitengine/purego"
)

// entryNames are the function table's entries in table order (xpu_api after its header).
var entryNames = []string{
	"get_info", "shutdown", "last_error", "device_count", "device_info", "op_support",
	"context_create", "context_release", "buffer_alloc", "buffer_import", "buffer_map",
	"buffer_unmap", "buffer_write", "buffer_read", "buffer_size", "buffer_release",
	"graph_analyze", "graph_prepare", "executable_serialize", "executable_release",
	"execution_create", "execution_bind", "execution_submit", "execution_run",
	"execution_release", "fence_create", "fence_wait", "fence_value", "fence_signal",
	"fence_release",
}

// funcs holds one Go function per table entry, bound with purego.RegisterFunc. A nil field is
// an entry the plugin's table does not have (past its struct_size, or NULL).
type funcs struct {
	getInfo      func(out *cPluginInfo) int32
	shutdown     func() int32
	lastError    func(h uint64, buf *byte, cap uint32, n *uint32) int32
	deviceCount  func(out *uint32) int32
	deviceInfo   func(dev uint32, out *cDeviceInfo) int32
	opSupport    func(dev uint32, q *cOpQuery, verdict *uint32) int32
	ctxCreate    func(dev uint32, opts *byte, out *uint64) int32
	ctxRelease   func(ctx uint64) int32
	bufAlloc     func(ctx, size uint64, kind uint32, out *uint64) int32
	bufImport    func(ctx uint64, desc *cImportDesc, out *uint64) int32
	bufMap       func(buf uint64, out *unsafe.Pointer) int32
	bufUnmap     func(buf uint64) int32
	bufWrite     func(buf, off uint64, src unsafe.Pointer, size uint64) int32
	bufRead      func(buf, off uint64, dst unsafe.Pointer, size uint64) int32
	bufSize      func(buf uint64, out *uint64) int32
	bufRelease   func(buf uint64) int32
	analyze      func(ctx uint64, ir unsafe.Pointer, size uint64, out *cNodeVerdict, cap uint32) int32
	prepare      func(ctx uint64, desc *cPrepareDesc, out *uint64) int32
	serialize    func(exe uint64, dst unsafe.Pointer, cap uint64, size *uint64) int32
	exeRelease   func(exe uint64) int32
	exCreate     func(exe uint64, out *uint64) int32
	exSubmit     func(ex uint64, waits *cFencePoint, n uint32, signal *cFencePoint) int32
	exRelease    func(ex uint64) int32
	fenceCreate  func(ctx, initial uint64, out *uint64) int32
	fenceWait    func(f, value uint64, timeoutNS int64) int32
	fenceValue   func(f uint64, out *uint64) int32
	fenceSignal  func(f, value uint64) int32
	fenceRelease func(f uint64) int32

	// the entries a scheduler calls for every task (execution_bind, execution_run), called
	// through purego.SyscallN: RegisterFunc's functions go through reflection, which costs
	// allocations and about half of the host's time per call
	exBindPtr, exRunPtr uintptr
}

// targets lists the fields of f in table order, matching entryNames; nil for the entries
// called by address (exBindPtr, exRunPtr).
func (f *funcs) targets() []any {
	return []any{&f.getInfo, &f.shutdown, &f.lastError, &f.deviceCount, &f.deviceInfo,
		&f.opSupport, &f.ctxCreate, &f.ctxRelease, &f.bufAlloc, &f.bufImport, &f.bufMap,
		&f.bufUnmap, &f.bufWrite, &f.bufRead, &f.bufSize, &f.bufRelease, &f.analyze, &f.prepare,
		&f.serialize, &f.exeRelease, &f.exCreate, nil, &f.exSubmit, nil,
		&f.exRelease, &f.fenceCreate, &f.fenceWait, &f.fenceValue, &f.fenceSignal,
		&f.fenceRelease}
}

// entries views the table's function pointers (after the header) as a slice.
func (p *Plugin) entries() []uintptr {
	return unsafe.Slice((*uintptr)(unsafe.Add(unsafe.Pointer(&p.table), apiHeaderSize)), len(entryNames))
}

// bind registers every non-NULL entry of t. t has already been cut at the plugin's
// struct_size, so an entry the plugin did not report is 0 here and stays unbound.
func (f *funcs) bind(t *cAPI) {
	entries := unsafe.Slice((*uintptr)(unsafe.Add(unsafe.Pointer(t), apiHeaderSize)), len(entryNames))
	for i, target := range f.targets() {
		if entries[i] != 0 && target != nil {
			purego.RegisterFunc(target, entries[i])
		}
	}
	f.exBindPtr, f.exRunPtr = entries[entryBind], entries[entryRun]
}

// the hot entries' indices in entryNames
var entryBind, entryRun = slices.Index(entryNames, "execution_bind"), slices.Index(entryNames, "execution_run")
