package abi

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"

	"github.com/xpuhub/xpu/core"
)

// The validation layer: a Calls that checks every call the host makes and every answer the
// plugin gives against the ABI's rules, as Vulkan's and IREE's validation layers do, and turns
// a broken rule into an error naming the call and the rule. It wraps the Calls under the
// core.Backend adapter (NewDevice), so the same checks see a plugin in this process and one in
// a child process. It is installed only when asked for (WithValidation, loader.WithValidation,
// XPU_VALIDATE=1): off, nothing of it is on any call's path.

// ErrValidation is what every validation-layer violation wraps.
var ErrValidation = errors.New("ABI validation failed")

// Rule is one rule the validation layer checks. A Rule is an error for errors.Is: a violation
// of the rule wraps it, and it wraps ErrValidation.
type Rule string

// The rules.
const (
	// RuleHandleLifetime: a handle the host passes is one the plugin returned, of the right
	// kind, not yet released (use-after-release), of the right context; a handle the plugin
	// returns is not 0 and not one still alive.
	RuleHandleLifetime Rule = "handle-lifetime"
	// RuleBufferBounds: every binding of a buffer (an execution io, a graph constant, a read
	// or write) lies inside the buffer.
	RuleBufferBounds Rule = "buffer-bounds"
	// RuleFenceOrder: a timeline fence never goes backwards, neither by a host signal nor in
	// the value the plugin reports.
	RuleFenceOrder Rule = "fence-monotonic"
	// RuleThreading: an execution (one binding set) is never bound, run or released while
	// another thread runs it, and a device without XPU_CAP_CONCURRENT never runs two
	// executions at once.
	RuleThreading Rule = "threading"
	// RuleAnalyzePrepare: graph_analyze answers YES or NO per node, and graph_prepare of a
	// graph it accepted on the context does not fail (nor succeed for one it refused).
	RuleAnalyzePrepare Rule = "analyze-prepare"
	// RulePrecision: a node runs at the precision graph_analyze reported: a known XPU_PREC_*,
	// the same for the same graph every time, and results as close to the reference as that
	// precision allows (checked on each executable's first synchronous run).
	RulePrecision Rule = "precision"
)

// Error names the rule.
func (r Rule) Error() string { return "ABI rule " + string(r) }

// Unwrap makes every rule an ErrValidation.
func (r Rule) Unwrap() error { return ErrValidation }

// Violation is one broken rule: which backend, which call, which rule, which side of the ABI
// broke it (the host's call or the plugin's answer) and how.
type Violation struct {
	Backend string
	Call    string
	Rule    Rule
	Plugin  bool // the plugin's answer broke the rule (false: the host's call did)
	Detail  string
}

func (v *Violation) Error() string {
	side := "host call"
	if v.Plugin {
		side = "plugin answer"
	}
	return fmt.Sprintf("validate: %s %s: rule %s broken by the %s: %s", v.Backend, v.Call, string(v.Rule), side, v.Detail)
}

// Unwrap is the rule (and so ErrValidation).
func (v *Violation) Unwrap() error { return v.Rule }

// Validated returns calls with every Calls it gives wrapped in the validation layer (one layer
// per distinct Calls, so a restarted isolated child gets fresh handle bookkeeping). devs are
// the plugin's devices as the adapter presents them (their caps decide the threading rule).
func Validated(calls func() (Calls, error), backend string, devs []core.DeviceInfo) func() (Calls, error) {
	var mu sync.Mutex
	var last Calls
	var lastV *Validator
	return func() (Calls, error) {
		c, err := calls()
		if err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		if lastV == nil || c != last {
			last, lastV = c, NewValidator(c, backend, devs)
		}
		return lastV, nil
	}
}

// precisionCheckMaxBytes bounds the graphs whose first run is compared with the reference:
// larger ones (a whole 7B layer) would take the reference seconds each.
const precisionCheckMaxBytes = 256 << 20

// Validator is the validation layer over one Calls (see Validated).
type Validator struct {
	inner   Calls
	backend string
	devs    []core.DeviceInfo
	seed    maphash.Seed

	mu       sync.Mutex
	objs     map[vkey]*vobj
	analyses map[analysisKey]analysis
	running  map[uint32]int // synchronous runs in flight per device
}

var _ Calls = (*Validator)(nil)

// NewValidator wraps inner; backend names it in violations, devs are its devices.
func NewValidator(inner Calls, backend string, devs []core.DeviceInfo) *Validator {
	return &Validator{inner: inner, backend: backend, devs: append([]core.DeviceInfo(nil), devs...),
		seed: maphash.MakeSeed(), objs: map[vkey]*vobj{}, analyses: map[analysisKey]analysis{},
		running: map[uint32]int{}}
}

type objKind uint8

const (
	kContext objKind = iota
	kBuffer
	kExecutable
	kExecution
	kFence
)

var kindNames = [...]string{"context", "buffer", "executable", "execution", "fence"}

func (k objKind) String() string { return kindNames[k] }

// vkey keys objects by kind too: the ABI does not promise one handle space for all kinds.
type vkey struct {
	kind objKind
	h    uint64
}

type vobj struct {
	released   bool
	releasedBy string
	dev        uint32
	ctx        uint64 // the context it belongs to (itself for a context)
	size       uint64 // buffers

	// executables
	ios     []uint64 // bytes of each io, inputs first
	noIR    bool     // its IR was beyond readIR: io counts and sizes unknown, left to the plugin
	prec    core.Precision
	precOK  bool // every verdict known (the graph was analyzed on this context)
	graph   *core.Graph
	checked bool // the precision check ran (or was skipped for good)

	// executions
	exe      uint64
	exeObj   *vobj    // the executable's record (a plugin may reuse the handle once released)
	binds    []uint64 // bound buffer per io (0 = not bound)
	offsets  []uint64 // and its offset
	inflight int

	// fences
	value uint64 // the highest value known reached or signalled
}

type analysisKey struct {
	ctx uint64
	ir  uint64 // hash of the IR bytes
}

type analysis struct {
	allYes  bool
	refused string // the first refused node, for messages
	precs   []core.Precision
}

func (v *Validator) violation(call string, rule Rule, plugin bool, format string, args ...any) error {
	return &Violation{Backend: v.backend, Call: call, Rule: rule, Plugin: plugin, Detail: fmt.Sprintf(format, args...)}
}

// use looks a handle the host passes up (v.mu held).
func (v *Validator) use(call string, kind objKind, h uint64) (*vobj, error) {
	o, ok := v.objs[vkey{kind, h}]
	switch {
	case !ok:
		return nil, v.violation(call, RuleHandleLifetime, false, "%s %#x was never returned by the plugin", kind, h)
	case o.released:
		return nil, v.violation(call, RuleHandleLifetime, false, "use after release: %s %#x was released by %s",
			kind, h, o.releasedBy)
	}
	return o, nil
}

// fresh records a handle the plugin returned (v.mu held).
func (v *Validator) fresh(call string, kind objKind, h uint64, o *vobj) error {
	if h == 0 {
		return v.violation(call, RuleHandleLifetime, true, "returned %s handle 0, which is never valid", kind)
	}
	if old, ok := v.objs[vkey{kind, h}]; ok && !old.released {
		return v.violation(call, RuleHandleLifetime, true, "returned %s %#x, which is still alive", kind, h)
	}
	v.objs[vkey{kind, h}] = o
	return nil
}

func (v *Validator) release(call string, kind objKind, h uint64, do func() error) error {
	v.mu.Lock()
	if _, err := v.use(call, kind, h); err != nil {
		v.mu.Unlock()
		return err
	}
	v.mu.Unlock()
	if err := do(); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if o, ok := v.objs[vkey{kind, h}]; ok {
		o.released, o.releasedBy = true, call
	}
	return nil
}

// check runs the host-side checks of a call under v.mu.
func (v *Validator) check(f func() error) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return f()
}

// OpSupport passes through: a static answer has no state to check.
func (v *Validator) OpSupport(dev uint32, q core.OpQuery) (core.Verdict, error) {
	return v.inner.OpSupport(dev, q)
}

// ContextCreate records the context.
func (v *Validator) ContextCreate(ctx context.Context, dev uint32, opts string) (uint64, error) {
	h, err := v.inner.ContextCreate(ctx, dev, opts)
	if err != nil {
		return h, err
	}
	return h, v.check(func() error {
		return v.fresh("context_create", kContext, h, &vobj{dev: dev, ctx: h})
	})
}

// ContextRelease checks the handle.
func (v *Validator) ContextRelease(cx uint64) error {
	return v.release("context_release", kContext, cx, func() error { return v.inner.ContextRelease(cx) })
}

func (v *Validator) newBuffer(call string, cx uint64, size uint64, do func() (uint64, error)) (uint64, error) {
	var dev uint32
	if err := v.check(func() error {
		c, err := v.use(call, kContext, cx)
		if c != nil {
			dev = c.dev
		}
		return err
	}); err != nil {
		return 0, err
	}
	h, err := do()
	if err != nil {
		return h, err
	}
	return h, v.check(func() error {
		return v.fresh(call, kBuffer, h, &vobj{dev: dev, ctx: cx, size: size})
	})
}

// BufferAlloc checks the context and records the buffer's size.
func (v *Validator) BufferAlloc(cx, size uint64, kind core.BufferKind) (uint64, error) {
	return v.newBuffer("buffer_alloc", cx, size, func() (uint64, error) { return v.inner.BufferAlloc(cx, size, kind) })
}

// BufferImportHost checks the context and records the buffer's size.
func (v *Validator) BufferImportHost(cx uint64, mem []byte) (uint64, error) {
	return v.newBuffer("buffer_import", cx, uint64(len(mem)), func() (uint64, error) {
		return v.inner.BufferImportHost(cx, mem)
	})
}

// BufferImportFD checks the context and records the buffer's size.
func (v *Validator) BufferImportFD(cx uint64, fd int, offset, size uint64) (uint64, error) {
	return v.newBuffer("buffer_import", cx, size, func() (uint64, error) {
		return v.inner.BufferImportFD(cx, fd, offset, size)
	})
}

// inBuffer checks that [off, off+n) lies inside a live buffer (v.mu held).
func (v *Validator) inBuffer(call, what string, buf, off, n uint64) (*vobj, error) {
	b, err := v.use(call, kBuffer, buf)
	if err != nil {
		return nil, err
	}
	if off > b.size || n > b.size-off {
		return b, v.violation(call, RuleBufferBounds, false, "%s [%d,+%d) outside buffer %#x of %d bytes", what,
			off, n, buf, b.size)
	}
	return b, nil
}

// BufferWrite checks the handle and the range.
func (v *Validator) BufferWrite(buf, offset uint64, src []byte) error {
	if err := v.check(func() error {
		_, err := v.inBuffer("buffer_write", "write", buf, offset, uint64(len(src)))
		return err
	}); err != nil {
		return err
	}
	return v.inner.BufferWrite(buf, offset, src)
}

// BufferRead checks the handle and the range.
func (v *Validator) BufferRead(buf, offset uint64, dst []byte) error {
	if err := v.check(func() error {
		_, err := v.inBuffer("buffer_read", "read", buf, offset, uint64(len(dst)))
		return err
	}); err != nil {
		return err
	}
	return v.inner.BufferRead(buf, offset, dst)
}

// BufferMap checks the handle and that the mapping covers the buffer.
func (v *Validator) BufferMap(buf uint64) ([]byte, error) {
	var size uint64
	if err := v.check(func() error {
		b, err := v.use("buffer_map", kBuffer, buf)
		if b != nil {
			size = b.size
		}
		return err
	}); err != nil {
		return nil, err
	}
	m, err := v.inner.BufferMap(buf)
	if err == nil && uint64(len(m)) < size {
		return nil, v.violation("buffer_map", RuleBufferBounds, true, "mapped %d bytes of a %d-byte buffer %#x",
			len(m), size, buf)
	}
	return m, err
}

// BufferUnmap checks the handle.
func (v *Validator) BufferUnmap(buf uint64) error {
	if err := v.check(func() error { _, err := v.use("buffer_unmap", kBuffer, buf); return err }); err != nil {
		return err
	}
	return v.inner.BufferUnmap(buf)
}

// BufferRelease checks the handle, and that no execution binding the buffer runs right now.
func (v *Validator) BufferRelease(buf uint64) error {
	if err := v.check(func() error {
		for k, o := range v.objs {
			if k.kind != kExecution || o.released || o.inflight == 0 {
				continue
			}
			for io, b := range o.binds {
				if b == buf {
					return v.violation("buffer_release", RuleThreading, false,
						"buffer %#x is bound to io %d of execution %#x, which another thread is running", buf, io, k.h)
				}
			}
		}
		return nil
	}); err != nil {
		return err
	}
	return v.release("buffer_release", kBuffer, buf, func() error { return v.inner.BufferRelease(buf) })
}
