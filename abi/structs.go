package abi

import "unsafe"

// Go mirrors of the structs of xpu_backend.h. Field order, types and explicit padding follow the
// header exactly; the `c` tag names the C field so that layout_test.go can compare every offset
// with what gcc computes. purego inserts no padding of its own, so these must match bit for bit.

type cProbeResult struct {
	StructSize uint32    `c:"struct_size"`
	ABIMajor   uint32    `c:"abi_major"`
	ABIMinor   uint32    `c:"abi_minor"`
	Score      int32     `c:"score"`
	Name       [32]byte  `c:"name"`
	Reason     [256]byte `c:"reason"`
}

type cHostInfo struct {
	StructSize uint32  `c:"struct_size"`
	ABIMajor   uint32  `c:"abi_major"`
	ABIMinor   uint32  `c:"abi_minor"`
	Reserved   uint32  `c:"reserved"`
	Log        uintptr `c:"log"`
	LogUser    uintptr `c:"log_user"`
	PluginDir  *byte   `c:"plugin_dir"`
}

type cPluginInfo struct {
	StructSize uint32   `c:"struct_size"`
	ABIMajor   uint32   `c:"abi_major"`
	ABIMinor   uint32   `c:"abi_minor"`
	OpsetMin   uint32   `c:"opset_min"`
	OpsetMax   uint32   `c:"opset_max"`
	IRVersion  uint32   `c:"ir_version"`
	Name       [32]byte `c:"name"`
	Vendor     [64]byte `c:"vendor"`
	Version    [32]byte `c:"version"`
	BuildID    [64]byte `c:"build_id"`
	SDKVersion [64]byte `c:"sdk_version"`
}

type cDeviceInfo struct {
	StructSize    uint32    `c:"struct_size"`
	Kind          uint32    `c:"kind"`
	Caps          uint64    `c:"caps"`
	MemoryBytes   uint64    `c:"memory_bytes"`
	ComputeUnits  uint32    `c:"compute_units"`
	Reserved      uint32    `c:"reserved"`
	Name          [128]byte `c:"name"`
	Vendor        [64]byte  `c:"vendor"`
	DriverVersion [64]byte  `c:"driver_version"`
	// ABI 1.1
	PeakReadBytesPerSec uint64 `c:"peak_read_bytes_per_s"`
	PeakFLOPSF32        uint64 `c:"peak_flops_f32"`
	PeakFLOPSF16        uint64 `c:"peak_flops_f16"`
	PeakOPSInt8         uint64 `c:"peak_ops_int8"`
}

type cOpQuery struct {
	StructSize  uint32 `c:"struct_size"`
	Op          uint32 `c:"op"`
	DTypeIn     uint32 `c:"dtype_in"`
	DTypeWeight uint32 `c:"dtype_weight"`
	DTypeOut    uint32 `c:"dtype_out"`
	Rank        uint32 `c:"rank"`
}

type cNodeVerdict struct {
	StructSize uint32    `c:"struct_size"`
	Verdict    uint32    `c:"verdict"`
	Precision  uint32    `c:"precision"`
	Reserved   uint32    `c:"reserved"`
	Reason     [128]byte `c:"reason"`
}

type cImportDesc struct {
	StructSize uint32         `c:"struct_size"`
	Kind       uint32         `c:"kind"`
	HostPtr    unsafe.Pointer `c:"host_ptr"`
	FD         int64          `c:"fd"`
	Offset     uint64         `c:"offset"`
	Size       uint64         `c:"size"`
}

type cPrepareDesc struct {
	StructSize uint32         `c:"struct_size"`
	Reserved   uint32         `c:"reserved"`
	IR         unsafe.Pointer `c:"ir"`
	IRSize     uint64         `c:"ir_size"`
	Options    *byte          `c:"options"`
	Cache      unsafe.Pointer `c:"cache"`
	CacheSize  uint64         `c:"cache_size"`
}

type cFencePoint struct {
	Fence uint64 `c:"fence"`
	Value uint64 `c:"value"`
}

// cAPI is xpu_api: a header and one C function pointer per entry, in table order. The entry
// names are also the keys of entryNames, used in errors and by CallWithNullOutputs.
type cAPI struct {
	StructSize uint32 `c:"struct_size"`
	ABIMajor   uint32 `c:"abi_major"`
	ABIMinor   uint32 `c:"abi_minor"`
	Reserved   uint32 `c:"reserved"`

	GetInfo             uintptr `c:"get_info"`
	Shutdown            uintptr `c:"shutdown"`
	LastError           uintptr `c:"last_error"`
	DeviceCount         uintptr `c:"device_count"`
	DeviceInfo          uintptr `c:"device_info"`
	OpSupport           uintptr `c:"op_support"`
	ContextCreate       uintptr `c:"context_create"`
	ContextRelease      uintptr `c:"context_release"`
	BufferAlloc         uintptr `c:"buffer_alloc"`
	BufferImport        uintptr `c:"buffer_import"`
	BufferMap           uintptr `c:"buffer_map"`
	BufferUnmap         uintptr `c:"buffer_unmap"`
	BufferWrite         uintptr `c:"buffer_write"`
	BufferRead          uintptr `c:"buffer_read"`
	BufferSize          uintptr `c:"buffer_size"`
	BufferRelease       uintptr `c:"buffer_release"`
	GraphAnalyze        uintptr `c:"graph_analyze"`
	GraphPrepare        uintptr `c:"graph_prepare"`
	ExecutableSerialize uintptr `c:"executable_serialize"`
	ExecutableRelease   uintptr `c:"executable_release"`
	ExecutionCreate     uintptr `c:"execution_create"`
	ExecutionBind       uintptr `c:"execution_bind"`
	ExecutionSubmit     uintptr `c:"execution_submit"`
	ExecutionRun        uintptr `c:"execution_run"`
	ExecutionRelease    uintptr `c:"execution_release"`
	FenceCreate         uintptr `c:"fence_create"`
	FenceWait           uintptr `c:"fence_wait"`
	FenceValue          uintptr `c:"fence_value"`
	FenceSignal         uintptr `c:"fence_signal"`
	FenceRelease        uintptr `c:"fence_release"`
}

// apiHeaderSize is the part of xpu_api before the first entry.
const apiHeaderSize = 16

// cString returns s as a NUL-terminated C string in Go memory, or nil for "" so that the
// plugin sees NULL (the header's "may be NULL" options).
func cString(s string) *byte {
	if s == "" {
		return nil
	}
	b := make([]byte, len(s)+1)
	copy(b, s)
	return &b[0]
}

// goString reads a fixed char array field up to its first NUL. A plugin that forgot the NUL
// gets its field truncated at the array's end, never read past it.
func goString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// cStringAt reads a NUL-terminated C string at p, at most max bytes.
func cStringAt(p *byte, max int) string {
	if p == nil {
		return ""
	}
	var n int
	for n < max && *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}
