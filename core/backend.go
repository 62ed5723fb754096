package core

import (
	"context"
	"fmt"
	"strings"
)

// DeviceKind is the class of processor, as XPU_DEVICE_*.
type DeviceKind uint32

// Device kinds.
const (
	DeviceCPU   DeviceKind = 0
	DeviceGPU   DeviceKind = 1
	DeviceNPU   DeviceKind = 2
	DeviceAccel DeviceKind = 3
)

// String gives the kind's lower-case name, or kind(N) for an unknown value.
func (k DeviceKind) String() string {
	return enumName([]string{DeviceCPU: "cpu", DeviceGPU: "gpu", DeviceNPU: "npu", DeviceAccel: "accel"}, k, "kind")
}

// Caps are device capability bits, as XPU_CAP_*.
type Caps uint64

// Capability bits. The conformance suite checks what a device claims.
const (
	CapAsync         Caps = 1 << 0  // Submit does not block
	CapImportHost    Caps = 1 << 1  // Import of host memory, zero-copy
	CapImportFD      Caps = 1 << 2  // ImportFD of memfd / dma-buf
	CapUnifiedMemory Caps = 1 << 3  // device and host share physical memory
	CapStaticShapes  Caps = 1 << 4  // shapes fixed at prepare (NPU-like)
	CapSerialize     Caps = 1 << 5  // Executable.Serialize and prepare from cache
	CapFP16          Caps = 1 << 6  // native half-precision arithmetic
	CapInt8          Caps = 1 << 7  // native int8 dot products
	CapConcurrent    Caps = 1 << 8  // executions may overlap
	CapHostVisible   Caps = 1 << 9  // Map works on allocated buffers
	CapEmulated      Caps = 1 << 10 // results come from an emulator, not hardware
)

var capNames = []string{"async", "import-host", "import-fd", "unified-memory", "static-shapes",
	"serialize", "fp16", "int8", "concurrent", "host-visible", "emulated"}

// Has reports whether every bit of c2 is set.
func (c Caps) Has(c2 Caps) bool { return c&c2 == c2 }

// Names lists the set bits' names.
func (c Caps) Names() []string {
	var out []string
	for i, n := range capNames {
		if c&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}

// String lists the set capability names, comma-separated.
func (c Caps) String() string { return strings.Join(c.Names(), ",") }

// BackendInfo identifies a loaded backend.
type BackendInfo struct {
	Name       string // "neon", "opencl", "qnn", "ref"
	Vendor     string
	Version    string
	BuildID    string // changes whenever results may change: part of every cache key
	SDKVersion string
	Path       string // the plugin file; "" for built-in backends
	Score      int    // the probe score it was chosen with
	Isolated   bool   // runs in a child process
}

// DeviceInfo describes one device of a backend.
type DeviceInfo struct {
	Backend      string
	Index        int
	Kind         DeviceKind
	Caps         Caps
	Name         string
	Vendor       string
	Driver       string
	MemoryBytes  uint64
	ComputeUnits int
	Peaks        Peaks // declared by the backend; zero fields are unknown
}

// Peaks are what a device declares it can reach at most, each 0 when unknown (xpu_device_info's
// ABI 1.1 fields).
type Peaks struct {
	ReadBytesPerSec uint64 // memory read bandwidth
	FLOPSF32        uint64 // f32 operations per second, a multiply-add counting 2
	FLOPSF16        uint64
	OPSInt8         uint64
}

// ID is "backend:index", the name the CLI and placement policies use.
func (d DeviceInfo) ID() string { return fmt.Sprintf("%s:%d", d.Backend, d.Index) }

// Verdict answers "can this device run that?", as XPU_VERDICT_*.
type Verdict uint32

// Verdicts.
const (
	VerdictNo    Verdict = 0
	VerdictYes   Verdict = 1
	VerdictMaybe Verdict = 2
)

// Precision is the arithmetic a node actually runs at, as XPU_PREC_*.
type Precision uint32

// Precisions.
const (
	PrecDefault Precision = 0
	PrecF32     Precision = 1
	PrecF16     Precision = 2
	PrecBF16    Precision = 3
	PrecInt8    Precision = 4
	PrecInt4    Precision = 5
)

// String gives the precision's lower-case name, or "?" for an unknown value.
func (p Precision) String() string {
	return [...]string{"default", "f32", "f16", "bf16", "int8", "int4", "?"}[min(int(p), 6)]
}

// OpQuery is the static capability question (Device.OpSupport).
type OpQuery struct {
	Op          Op
	DTypeIn     DType
	DTypeWeight DType // MATMUL b, GET_ROWS table, SPARSE_FFN bundles; 0 = n/a
	DTypeOut    DType
	Rank        int
}

// QueryFor builds the OpQuery that describes node n.
func QueryFor(n *Node) OpQuery {
	q := OpQuery{Op: n.Op, DTypeOut: n.Output.DType, Rank: len(n.Output.Shape)}
	if len(n.Inputs) > 0 {
		q.DTypeIn = n.Inputs[0].DType
	}
	switch {
	case (n.Op == OpMatMul || n.Op == OpSparseFFN) && len(n.Inputs) > 1:
		// SPARSE_FFN's bundles are its weights: a backend answers by their dtype.
		q.DTypeWeight = n.Inputs[1].DType
	case n.Op == OpGetRows:
		q.DTypeWeight = q.DTypeIn
	}
	return q
}

// NodeVerdict is a backend's authoritative answer for one node (Context.Analyze).
type NodeVerdict struct {
	Supported bool
	Precision Precision
	Reason    string // why not, when !Supported
}

// Backend is a loaded backend: a plugin in this process, a plugin in a child process, or the
// built-in reference. Everything above the loader sees only this interface.
type Backend interface {
	Info() BackendInfo
	Devices() []Device
	// Close shuts the backend down; its devices and everything made from them become invalid.
	Close() error
}

// Device is one processor of a backend.
type Device interface {
	Info() DeviceInfo
	// OpSupport is the cheap static answer; Context.Analyze is the authoritative one.
	OpSupport(q OpQuery) Verdict
	// NewContext opens a context: the owner of buffers and executables. options are
	// backend-specific ("threads": "2", "cpus": "0,1").
	NewContext(ctx context.Context, options map[string]string) (Context, error)
}

// BufferKind chooses where an allocated buffer lives.
type BufferKind uint32

// Buffer kinds, as XPU_BUFFER_*.
const (
	BufferDevice      BufferKind = 0
	BufferHostVisible BufferKind = 1
)

// Context owns buffers, executables and fences on one device. It is safe for concurrent use.
type Context interface {
	Device() Device
	// Alloc makes a buffer of size bytes.
	Alloc(size int64, kind BufferKind) (Buffer, error)
	// Import wraps host memory without a copy (ErrUnsupported without CapImportHost). mem must
	// outlive the buffer and must not move (mmap'd or C memory; not a Go heap slice for plugins
	// that keep the pointer across calls).
	Import(mem []byte) (Buffer, error)
	// ImportFD wraps size bytes at offset of a memfd/dma-buf fd (ErrUnsupported without
	// CapImportFD). The backend dups fd if it keeps it.
	ImportFD(fd int, offset, size int64) (Buffer, error)
	// Analyze returns one verdict per node of g.
	Analyze(ctx context.Context, g *Graph) ([]NodeVerdict, error)
	// Prepare compiles g. Constants are uploaded once per context. ErrUnsupported (wrapped,
	// naming the node) if a node is refused.
	Prepare(ctx context.Context, g *Graph, opts ...PrepareOption) (Executable, error)
	// NewFence makes a timeline fence starting at initial.
	NewFence(initial uint64) (Fence, error)
	// Close releases the context; ErrBadState while buffers or executables are alive.
	Close() error
}

// Buffer is device memory.
type Buffer interface {
	Size() int64
	Write(offset int64, src []byte) error
	Read(offset int64, dst []byte) error
	// Map returns the bytes of a host-visible or imported buffer, valid until Unmap.
	Map() ([]byte, error)
	Unmap() error
	Close() error
}

// Executable is a prepared graph. It is immutable and safe for concurrent use.
type Executable interface {
	// NewExecution makes one binding set; an execution runs one submission at a time.
	NewExecution() (Execution, error)
	// Serialize returns a blob that PrepareOption WithCache turns back into this executable
	// without recompiling (ErrUnsupported without CapSerialize).
	Serialize() ([]byte, error)
	// Verdicts are the per-node answers it was prepared with (precision actually used).
	Verdicts() []NodeVerdict
	Close() error
}

// Execution binds the graph's inputs, then outputs (in Graph.Inputs, Graph.Outputs order),
// to (buffer, offset), and runs.
type Execution interface {
	Bind(io int, buf Buffer, offset int64) error
	// Run executes synchronously; ctx cancels the wait.
	Run(ctx context.Context) error
	// Submit starts the execution after every wait point is reached and signals signal when
	// done (may be nil). It returns without waiting on devices with CapAsync.
	Submit(waits []FencePoint, signal *FencePoint) error
	Close() error
}

// Fence is a timeline semaphore.
type Fence interface {
	Wait(ctx context.Context, value uint64) error
	Value() (uint64, error)
	Signal(value uint64) error
	Close() error
}

// FencePoint is a fence and a timeline value.
type FencePoint struct {
	Fence Fence
	Value uint64
}

// PrepareConfig collects PrepareOptions.
type PrepareConfig struct {
	Options map[string]string // backend-specific
	Cache   []byte            // an earlier Executable.Serialize result
}

// PrepareOption configures Context.Prepare.
type PrepareOption func(*PrepareConfig)

// WithCache prepares from a serialized executable when the backend accepts it.
func WithCache(blob []byte) PrepareOption { return func(c *PrepareConfig) { c.Cache = blob } }

// WithPrepareOption passes a backend-specific key=value.
func WithPrepareOption(key, value string) PrepareOption {
	return func(c *PrepareConfig) {
		if c.Options == nil {
			c.Options = map[string]string{}
		}
		c.Options[key] = value
	}
}

// NewPrepareConfig applies opts.
func NewPrepareConfig(opts ...PrepareOption) PrepareConfig {
	var c PrepareConfig
	for _, o := range opts {
		o(&c)
	}
	return c
}

// Restarter is a backend that can start afresh (an isolated one: a fresh child process) after a
// crash, or at any time. Everything made from before stays invalid and answers
// ErrBackendCrashed; devices and new contexts work again.
type Restarter interface {
	Restart(ctx context.Context) error
}

// Liveness is a backend that can tell, without a call into it, whether it still answers (an
// isolated one: whether its child process runs). A backend without it lives as long as the
// process does.
type Liveness interface {
	// Alive is nil, or an error wrapping ErrBackendCrashed.
	Alive() error
}

// Alive says whether b can still answer calls (Liveness); cheap enough for every request.
func Alive(b Backend) error {
	if l, ok := b.(Liveness); ok {
		return l.Alive()
	}
	return nil
}
