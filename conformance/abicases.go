package conformance

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/core"
)

// Level 1: the ABI and lifecycle, through the raw plugin API: probe and info, every misuse
// the header names (stale and foreign handles, wrong order, wrong bindings, bad IR, null
// pointers, release while in flight) must come back as the right status with a last_error
// message, never as a crash.

func abiCases() []testCase {
	cases := []struct {
		name string
		run  func(c *abiCheck)
	}{
		{"probe-info", (*abiCheck).probeInfo},
		{"stale-and-foreign-handles", (*abiCheck).staleHandles},
		{"lifecycle-order", (*abiCheck).lifecycle},
		{"wrong-bindings", (*abiCheck).wrongBindings},
		{"import-ranges", (*abiCheck).importRanges},
		{"bad-ir", (*abiCheck).badIR},
		{"huge-shapes", (*abiCheck).hugeShapes},
		{"rejected-shapes", (*abiCheck).rejectedShapes},
		{"null-pointers", (*abiCheck).nullPointers},
		{"fences-and-submit", (*abiCheck).fences},
		{"release-in-flight", (*abiCheck).releaseInFlight},
		{"fence-chain", (*abiCheck).fenceChain},
	}
	var cs []testCase
	for _, c := range cases {
		cs = append(cs, testCase{name: "ABI(" + c.name + ")", level: 1, op: "ABI", dtype: c.name,
			run: func(r *runner, ctx context.Context, res *CaseResult) {
				if r.plugin == nil {
					res.Status, res.Reason = StatusSkipped, "not a plugin loaded in this process: level 1 needs the raw ABI"
					return
				}
				ac := &abiCheck{p: r.plugin, res: res, dev: uint32(r.cfg.device), ctx: ctx}
				defer ac.cleanup()
				c.run(ac)
			}})
	}
	return cs
}

// abiCheck runs raw calls and records every deviation on res.
type abiCheck struct {
	p     *abi.Plugin
	res   *CaseResult
	dev   uint32
	ctx   context.Context
	undo  []func() // releases, run in reverse by cleanup
	fatal bool     // a setup call failed: the rest of the case is meaningless
	added addBufs  // what bindAdd bound
}

func (c *abiCheck) cleanup() {
	for i := len(c.undo) - 1; i >= 0; i-- {
		c.undo[i]()
	}
}

// expect checks a status: got must be one of want; a failure status must come with a
// last_error message on h.
func (c *abiCheck) expect(what string, h uint64, got abi.Status, want ...abi.Status) bool {
	if !slices.Contains(want, got) {
		msg := ""
		if got != abi.StatusOK {
			msg = fmt.Sprintf(" (last_error: %q)", c.p.LastError(h))
		}
		c.res.fail(CatError, "%s: returned %s, want %v%s", what, got, want, msg)
		return false
	}
	if got != abi.StatusOK && c.p.LastError(h) == "" {
		c.res.fail(CatError, "%s: returned %s with an empty last_error message", what, got)
	}
	return true
}

// must is expect(OK) for setup calls; a failure stops the case.
func (c *abiCheck) must(what string, h uint64, got abi.Status) bool {
	if c.fatal {
		return false
	}
	if !c.expect(what, h, got, abi.StatusOK) {
		c.fatal = true
	}
	return !c.fatal
}

func (c *abiCheck) context() (uint64, bool) {
	h, st := c.p.ContextCreate(c.dev, "")
	if !c.must("context_create", 0, st) {
		return 0, false
	}
	c.undo = append(c.undo, func() { c.p.ContextRelease(h) })
	return h, true
}

func (c *abiCheck) buffer(ctx, size uint64) (uint64, bool) {
	h, st := c.p.BufferAlloc(ctx, size, uint32(core.BufferDevice))
	if !c.must(fmt.Sprintf("buffer_alloc(%d)", size), ctx, st) {
		return 0, false
	}
	c.undo = append(c.undo, func() { c.p.BufferRelease(h) })
	return h, true
}

// addGraph is ADD of two f32 [16] inputs: 64 bytes per io.
func addGraph() (*core.Graph, []byte, error) {
	g := core.NewGraph()
	g.Output(g.Add(g.Input("a", core.F32, 16), g.Input("b", core.F32, 16)))
	ir, err := abi.EncodeGraph(g, nil)
	return g, ir, err
}

// addIR is addGraph's IR; a failure to encode it ends the case.
func (c *abiCheck) addIR() ([]byte, bool) {
	_, ir, err := addGraph()
	if err != nil {
		c.res.fail(CatError, "encoding the test graph: %v", err)
		c.fatal = true
		return nil, false
	}
	return ir, true
}

// executable prepares addGraph in ctx.
func (c *abiCheck) executable(ctx uint64) (uint64, bool) {
	ir, ok := c.addIR()
	if !ok {
		return 0, false
	}
	h, st := c.p.GraphPrepare(ctx, ir, "", nil)
	if st == abi.StatusUnsupported {
		c.res.Status, c.res.Reason = StatusUnsupported, "the device does not run an f32 ADD"
		c.fatal = true
		return 0, false
	}
	if !c.must("graph_prepare(ADD)", ctx, st) {
		return 0, false
	}
	c.undo = append(c.undo, func() { c.p.ExecutableRelease(h) })
	return h, true
}

func (c *abiCheck) execution(exe uint64) (uint64, bool) {
	h, st := c.p.ExecutionCreate(exe)
	if !c.must("execution_create", exe, st) {
		return 0, false
	}
	c.undo = append(c.undo, func() { c.p.ExecutionRelease(h) })
	return h, true
}

func (c *abiCheck) probeInfo() {
	pr := c.p.ProbeResult()
	if pr.Score <= 0 || pr.Name == "" {
		c.res.fail(CatError, "probe: score %d, name %q: an opened plugin needs a score > 0 and a name", pr.Score, pr.Name)
	}
	info, st := c.p.GetInfo()
	if !c.must("get_info", 0, st) {
		return
	}
	switch {
	case info.ABIMajor != abi.ABIMajor:
		c.res.fail(CatError, "get_info: ABI major %d, the host speaks %d", info.ABIMajor, abi.ABIMajor)
	case info.OpsetMin > core.OpsetVersion || info.OpsetMax < core.OpsetVersion || info.OpsetMin > info.OpsetMax:
		c.res.fail(CatError, "get_info: op-set range [%d, %d] does not contain %d", info.OpsetMin, info.OpsetMax, core.OpsetVersion)
	case info.IRVersion < abi.IRVersion:
		c.res.fail(CatError, "get_info: IR version %d < %d", info.IRVersion, abi.IRVersion)
	case info.Name != pr.Name:
		c.res.fail(CatError, "get_info: name %q differs from the probe's %q", info.Name, pr.Name)
	case info.BuildID == "":
		c.res.fail(CatError, "get_info: empty build_id (caches are keyed by it)")
	}
	n, st := c.p.DeviceCount()
	if !c.must("device_count", 0, st) {
		return
	}
	if n <= c.dev {
		c.res.fail(CatError, "device_count %d: no device %d", n, c.dev)
		return
	}
	for d := range n {
		di, st := c.p.DeviceInfo(d)
		if c.expect(fmt.Sprintf("device_info(%d)", d), 0, st, abi.StatusOK) && di.Kind > core.DeviceAccel {
			c.res.fail(CatError, "device_info(%d): kind %d is not an XPU_DEVICE_*", d, di.Kind)
		}
	}
	_, st = c.p.DeviceInfo(n)
	c.expect("device_info(past the last device)", 0, st, abi.StatusInvalidArg)
	_, st = c.p.ContextCreate(n, "")
	c.expect("context_create(past the last device)", 0, st, abi.StatusInvalidArg)
	v, st := c.p.OpSupport(c.dev, core.OpQuery{Op: core.Op(999), DTypeIn: core.F32, DTypeOut: core.F32, Rank: 1})
	if st == abi.StatusOK && v != core.VerdictNo {
		c.res.fail(CatCapabilityLie, "op_support: verdict %d for op 999, which does not exist", v)
	} else if st != abi.StatusOK {
		c.expect("op_support(op 999)", 0, st, abi.StatusInvalidArg, abi.StatusUnsupported)
	}
}

// junk handles no plugin can have issued: 0 and a never-used slot with a high generation.
var junkHandles = []uint64{0, 0xDEADBEEF00000042}

func (c *abiCheck) staleHandles() {
	ctx, ok := c.context()
	if !ok {
		return
	}
	buf, st := c.p.BufferAlloc(ctx, 256, uint32(core.BufferDevice))
	if !c.must("buffer_alloc", ctx, st) {
		return
	}
	c.expect("buffer_release", buf, c.p.BufferRelease(buf), abi.StatusOK)
	c.expect("buffer_release twice", buf, c.p.BufferRelease(buf), abi.StatusInvalidHandle)
	_, st = c.p.BufferSize(buf)
	c.expect("buffer_size(released)", buf, st, abi.StatusInvalidHandle)
	c.expect("buffer_write(released)", buf, c.p.BufferWrite(buf, 0, make([]byte, 4)), abi.StatusInvalidHandle)
	c.expect("buffer_read(released)", buf, c.p.BufferRead(buf, 0, make([]byte, 4)), abi.StatusInvalidHandle)
	// a live handle of the wrong type is foreign
	_, st = c.p.BufferSize(ctx)
	c.expect("buffer_size(a context handle)", ctx, st, abi.StatusInvalidHandle)
	live, ok := c.buffer(ctx, 64)
	if !ok {
		return
	}
	c.expect("execution_run(a buffer handle)", live, c.p.ExecutionRun(live), abi.StatusInvalidHandle)
	c.expect("context_release(a buffer handle)", live, c.p.ContextRelease(live), abi.StatusInvalidHandle)
	for _, h := range junkHandles {
		_, st = c.p.BufferSize(h)
		c.expect(fmt.Sprintf("buffer_size(%#x)", h), h, st, abi.StatusInvalidHandle)
		c.expect(fmt.Sprintf("executable_release(%#x)", h), h, c.p.ExecutableRelease(h), abi.StatusInvalidHandle)
		_, st = c.p.ExecutionCreate(h)
		c.expect(fmt.Sprintf("execution_create(%#x) (execute before prepare)", h), h, st, abi.StatusInvalidHandle)
		c.expect(fmt.Sprintf("execution_run(%#x)", h), h, c.p.ExecutionRun(h), abi.StatusInvalidHandle)
		_, st = c.p.FenceValue(h)
		c.expect(fmt.Sprintf("fence_value(%#x)", h), h, st, abi.StatusInvalidHandle)
		_, st = c.p.BufferAlloc(h, 64, uint32(core.BufferDevice))
		c.expect(fmt.Sprintf("buffer_alloc(context %#x)", h), h, st, abi.StatusInvalidHandle)
	}
}

func (c *abiCheck) lifecycle() {
	ctx, st := c.p.ContextCreate(c.dev, "")
	if !c.must("context_create", 0, st) {
		return
	}
	released := false
	c.undo = append(c.undo, func() {
		if !released {
			c.p.ContextRelease(ctx)
		}
	})
	buf, st := c.p.BufferAlloc(ctx, 64, uint32(core.BufferDevice))
	if !c.must("buffer_alloc", ctx, st) {
		return
	}
	c.expect("context_release with a live buffer", ctx, c.p.ContextRelease(ctx), abi.StatusBadState)
	_, st = c.p.BufferAlloc(ctx, 64, 77)
	c.expect("buffer_alloc(kind 77)", ctx, st, abi.StatusInvalidArg)
	// released on the way below; the undo entries only matter when the case stops early (a
	// second release of a handle is a harmless INVALID_HANDLE: handles never come back)
	c.undo = append(c.undo, func() { c.p.BufferRelease(buf) })
	ir, ok := c.addIR()
	if !ok {
		return
	}
	exe, st := c.p.GraphPrepare(ctx, ir, "", nil)
	if st == abi.StatusUnsupported {
		c.res.Status, c.res.Reason = StatusUnsupported, "the device does not run an f32 ADD"
		return
	}
	if !c.must("graph_prepare(ADD)", ctx, st) {
		return
	}
	c.undo = append(c.undo, func() { c.p.ExecutableRelease(exe) })
	ex, st := c.p.ExecutionCreate(exe)
	if !c.must("execution_create", exe, st) {
		return
	}
	c.undo = append(c.undo, func() { c.p.ExecutionRelease(ex) })
	c.expect("execution_run with nothing bound", ex, c.p.ExecutionRun(ex), abi.StatusBadState)
	c.expect("execution_bind(0)", ex, c.p.ExecutionBind(ex, 0, buf, 0), abi.StatusOK)
	c.expect("execution_run with one of three io bound", ex, c.p.ExecutionRun(ex), abi.StatusBadState)
	c.expect("context_release with live children", ctx, c.p.ContextRelease(ctx), abi.StatusBadState)
	c.expect("execution_release", ex, c.p.ExecutionRelease(ex), abi.StatusOK)
	c.expect("execution_run after release", ex, c.p.ExecutionRun(ex), abi.StatusInvalidHandle)
	c.expect("execution_release twice", ex, c.p.ExecutionRelease(ex), abi.StatusInvalidHandle)
	c.expect("executable_release", exe, c.p.ExecutableRelease(exe), abi.StatusOK)
	_, st = c.p.ExecutionCreate(exe)
	c.expect("execution_create on a released executable", exe, st, abi.StatusInvalidHandle)
	c.expect("buffer_release", buf, c.p.BufferRelease(buf), abi.StatusOK)
	c.expect("context_release", ctx, c.p.ContextRelease(ctx), abi.StatusOK)
	released = true
	c.expect("context_release twice", ctx, c.p.ContextRelease(ctx), abi.StatusInvalidHandle)
}

func (c *abiCheck) wrongBindings() {
	ctx, ok := c.context()
	if !ok {
		return
	}
	exe, ok := c.executable(ctx)
	if !ok {
		return
	}
	ex, ok := c.execution(exe)
	if !ok {
		return
	}
	small, ok1 := c.buffer(ctx, 32)
	fits, ok2 := c.buffer(ctx, 64)
	if !ok1 || !ok2 {
		return
	}
	c.expect("execution_bind(io 3 of 3)", ex, c.p.ExecutionBind(ex, 3, fits, 0), abi.StatusInvalidArg)
	c.expect("execution_bind(32-byte buffer for a 64-byte tensor)", ex, c.p.ExecutionBind(ex, 0, small, 0), abi.StatusInvalidArg)
	c.expect("execution_bind(offset 8 of a 64-byte buffer)", ex, c.p.ExecutionBind(ex, 0, fits, 8), abi.StatusInvalidArg)
	c.expect("execution_bind(offset 2^63)", ex, c.p.ExecutionBind(ex, 0, fits, 1<<63), abi.StatusInvalidArg)
	c.expect("execution_bind(offset 2^64-8)", ex, c.p.ExecutionBind(ex, 0, fits, ^uint64(7)), abi.StatusInvalidArg)
	gone, st := c.p.BufferAlloc(ctx, 64, uint32(core.BufferDevice))
	if c.must("buffer_alloc", ctx, st) {
		c.p.BufferRelease(gone)
		c.expect("execution_bind(a released buffer)", ex, c.p.ExecutionBind(ex, 0, gone, 0), abi.StatusInvalidHandle)
	}
	c.expect("buffer_write past the end", fits, c.p.BufferWrite(fits, 60, make([]byte, 8)), abi.StatusInvalidArg)
	c.expect("buffer_read past the end", fits, c.p.BufferRead(fits, 1<<63, make([]byte, 8)), abi.StatusInvalidArg)
	// another context's buffer is foreign to this execution
	other, ok := c.context()
	if !ok {
		return
	}
	ob, ok := c.buffer(other, 64)
	if ok {
		c.expect("execution_bind(a buffer of another context)", ex, c.p.ExecutionBind(ex, 0, ob, 0),
			abi.StatusInvalidArg, abi.StatusInvalidHandle)
	}
}

// importRanges: an fd import whose offset plus size does not fit must be refused, never mapped
// short (a wrapped length would let later reads and writes run past the mapping).
func (c *abiCheck) importRanges() {
	ctx, ok := c.context()
	if !ok {
		return
	}
	fd, _, release, err := memfdMemory(4096)
	if err != nil {
		c.res.Status, c.res.Reason = StatusSkipped, fmt.Sprintf("no memfd here: %v", err)
		return
	}
	defer release()
	for _, r := range []struct{ off, size uint64 }{{100, ^uint64(0) - 50}, {0, ^uint64(0)}, {1 << 63, 64}} {
		h, st := c.p.BufferImportFD(ctx, fd, r.off, r.size)
		if st == abi.StatusOK {
			c.p.BufferRelease(h)
		}
		c.expect(fmt.Sprintf("buffer_import(fd, offset %d, size %d)", r.off, r.size), ctx, st,
			abi.StatusInvalidArg, abi.StatusUnsupported, abi.StatusOutOfMemory)
	}
}

func (c *abiCheck) badIR() {
	ctx, ok := c.context()
	if !ok {
		return
	}
	_, good, err := addGraph()
	if err != nil {
		c.res.fail(CatError, "encoding the test graph: %v", err)
		return
	}
	// aligned copies: the reader rightly rejects a misaligned blob, which is not what is tested
	aligned := func(b []byte) []byte {
		out := make([]byte, len(b), len(b)+8) // heap blocks of >= 16 bytes are 8-byte aligned
		copy(out, b)
		return out
	}
	bad := map[string][]byte{}
	bad["truncated header"] = aligned(good[:16])
	bad["truncated nodes"] = aligned(good[:len(good)-20])
	magic := aligned(good)
	binary.LittleEndian.PutUint32(magic[0:], 0x12345678)
	bad["bad magic"] = magic
	huge := aligned(good)
	binary.LittleEndian.PutUint32(huge[12:], 1<<30) // n_tensors
	bad["tensor count 2^30"] = huge
	badIn := aligned(good)
	binary.LittleEndian.PutUint32(badIn[32+3*64+8:], 9999) // node 0, input 0
	bad["node input out of range"] = badIn
	for _, name := range []string{"truncated header", "truncated nodes", "bad magic", "tensor count 2^30", "node input out of range"} {
		_, st := c.p.GraphAnalyze(ctx, bad[name], 4)
		c.expect("graph_analyze("+name+")", ctx, st, abi.StatusInvalidArg)
		_, st = c.p.GraphPrepare(ctx, bad[name], "", nil)
		c.expect("graph_prepare("+name+")", ctx, st, abi.StatusInvalidArg)
	}
	ver := aligned(good)
	binary.LittleEndian.PutUint32(ver[4:], 99)
	_, st := c.p.GraphPrepare(ctx, ver, "", nil)
	c.expect("graph_prepare(IR version 99)", ctx, st, abi.StatusIncompatible)
	_, st = c.p.GraphAnalyze(ctx, good, 0)
	c.expect("graph_analyze(room for 0 verdicts)", ctx, st, abi.StatusInvalidArg)
}

// hugeShapes sends IR whose every dimension is in range but whose element counts or byte
// sizes are not: products that wrap a 64-bit integer (to 16, the size of the buffers a careless
// plugin then binds, or to -1) and one whose byte size wraps. xpu_ir_parse bounds them; a
// plugin that accepts one sizes its buffers from a wrapped count and indexes far outside them.
func (c *abiCheck) hugeShapes() {
	ctx, ok := c.context()
	if !ok {
		return
	}
	good, ok := c.addIR()
	if !ok {
		return
	}
	le := binary.LittleEndian
	// tensor i's record starts at 32+64i: dtype, rank, shape[4] at +8; node 0 at 32+3*64
	withShape := func(b []byte, tensor int, shape ...int64) {
		r := b[32+64*tensor:]
		le.PutUint32(r[4:], uint32(len(shape)))
		for d := 0; d < 4; d++ {
			v := int64(1)
			if d < len(shape) {
				v = shape[d]
			}
			le.PutUint64(r[8+8*d:], uint64(v))
		}
	}
	aligned := func() []byte {
		out := make([]byte, len(good), len(good)+8) // heap blocks of >= 16 bytes are 8-byte aligned
		copy(out, good)
		return out
	}
	wrap16 := []int64{65552, 61681, 4562284561} // product 2^64 + 16
	graphs := []struct {
		name string
		blob []byte
	}{}
	add := func(name string, edit func(b []byte)) {
		b := aligned()
		edit(b)
		graphs = append(graphs, struct {
			name string
			blob []byte
		}{name, b})
	}
	add("ADD of 2^64+16 elements", func(b []byte) {
		for i := range 3 {
			withShape(b, i, wrap16...)
		}
	})
	add("ADD of 2^64-1 elements", func(b []byte) {
		for i := range 3 {
			withShape(b, i, 1<<32+1, 1<<32-1)
		}
	})
	add("ADD of 2^62 f32 (2^64 bytes)", func(b []byte) {
		for i := range 3 {
			withShape(b, i, 1<<40, 1<<22)
		}
	})
	add("RESHAPE [16] to 2^64+16 elements", func(b []byte) {
		node := b[32+3*64:]
		le.PutUint32(node[0:], uint32(core.OpReshape))
		le.PutUint32(node[4:], 1)
		le.PutUint32(node[12:], 0xFFFFFFFF) // inputs[1]: none
		withShape(b, 2, wrap16...)
	})
	for _, gr := range graphs {
		_, st := c.p.GraphAnalyze(ctx, gr.blob, 4)
		c.expect("graph_analyze("+gr.name+")", ctx, st, abi.StatusInvalidArg)
		exe, st := c.p.GraphPrepare(ctx, gr.blob, "", nil)
		if st == abi.StatusOK {
			c.p.ExecutableRelease(exe)
		}
		c.expect("graph_prepare("+gr.name+")", ctx, st, abi.StatusInvalidArg)
	}
}

// rejectedShapes sends every node core.InferOutput refuses (core.RejectedNodes: wrong arity,
// shapes, dtypes, attributes, outputs) as raw IR, which the Go adapter would never let through.
// The plugin must answer NO for the node (or refuse the IR) and refuse to prepare it: its C
// rules (abi/xpu_validate.h) and the Go ones agree, and no kernel sees a node it cannot run.
func (c *abiCheck) rejectedShapes() {
	ctx, ok := c.context()
	if !ok {
		return
	}
	for _, rn := range core.RejectedNodes() {
		blob, err := abi.EncodeGraph(rn.Graph, nil)
		if err != nil {
			c.res.fail(CatError, "encoding %q: %v", rn.Name, err)
			continue
		}
		vs, st := c.p.GraphAnalyze(ctx, blob, 1)
		switch {
		case st == abi.StatusOK && len(vs) == 1 && vs[0].Verdict == core.VerdictNo:
			if vs[0].Reason == "" {
				c.res.fail(CatError, "graph_analyze(%s): NO without a reason", rn.Name)
			}
		case st == abi.StatusOK:
			c.res.fail(CatError, "graph_analyze(%s): accepted a node the op's rules refuse", rn.Name)
		default:
			c.expect("graph_analyze("+rn.Name+")", ctx, st, abi.StatusInvalidArg, abi.StatusUnsupported)
		}
		exe, st := c.p.GraphPrepare(ctx, blob, "", nil)
		if st == abi.StatusOK {
			c.p.ExecutableRelease(exe)
			c.res.fail(CatError, "graph_prepare(%s): prepared a node the op's rules refuse", rn.Name)
			continue
		}
		c.expect("graph_prepare("+rn.Name+")", ctx, st, abi.StatusInvalidArg, abi.StatusUnsupported)
	}
}

func (c *abiCheck) nullPointers() {
	calls := c.p.CallWithNullOutputs()
	if len(calls) == 0 {
		c.res.fail(CatError, "no entry could be called with NULL (every setup call failed)")
	}
	for key, st := range calls {
		want := []abi.Status{abi.StatusInvalidArg}
		if key == "executable_serialize" {
			want = append(want, abi.StatusUnsupported)
		}
		if !slices.Contains(want, st) {
			c.res.fail(CatError, "%s with NULL: returned %s, want %v", key, st, want)
		}
	}
}

func (c *abiCheck) fences() {
	ctx, ok := c.context()
	if !ok {
		return
	}
	f, st := c.p.FenceCreate(ctx, 5)
	if !c.must("fence_create", ctx, st) {
		return
	}
	c.undo = append(c.undo, func() { c.p.FenceRelease(f) })
	if v, st := c.p.FenceValue(f); c.expect("fence_value", f, st, abi.StatusOK) && v != 5 {
		c.res.fail(CatError, "fence_value: %d, created at 5", v)
	}
	c.expect("fence_signal(7)", f, c.p.FenceSignal(f, 7), abi.StatusOK)
	if v, st := c.p.FenceValue(f); c.expect("fence_value", f, st, abi.StatusOK) && v != 7 {
		c.res.fail(CatError, "fence_value: %d after signal 7", v)
	}
	c.expect("fence_wait(reached)", f, c.p.FenceWait(f, 7, 0), abi.StatusOK)
	c.expect("fence_wait(not reached, 1 ms)", f, c.p.FenceWait(f, 8, time.Millisecond), abi.StatusTimeout)

	// submit waiting on a reached point and signalling another fence: the result must be there
	exe, ok := c.executable(ctx)
	if !ok {
		return
	}
	ex, ok := c.execution(exe)
	if !ok {
		return
	}
	done, st := c.p.FenceCreate(ctx, 0)
	if !c.must("fence_create", ctx, st) {
		return
	}
	c.undo = append(c.undo, func() { c.p.FenceRelease(done) })
	c.bindAdd(ctx, ex)
	if c.fatal {
		return
	}
	c.expect("execution_submit", ex, c.p.ExecutionSubmit(ex, []abi.FencePoint{{Fence: f, Value: 7}},
		&abi.FencePoint{Fence: done, Value: 1}), abi.StatusOK)
	c.expect("fence_wait(the submission's signal)", done, c.p.FenceWait(done, 1, 30*time.Second), abi.StatusOK)
	c.checkAdd()
	c.expect("fence_release", f, c.p.FenceRelease(f), abi.StatusOK)
	c.expect("fence_release twice", f, c.p.FenceRelease(f), abi.StatusInvalidHandle)
}

// addBufs are the three buffers bindAdd bound: a, b and the output.
type addBufs struct{ bufs [3]uint64 }

// bindAdd binds a = i, b = 2i and an output to ex.
func (c *abiCheck) bindAdd(ctx, ex uint64) {
	a, b := make([]float32, 16), make([]float32, 16)
	for i := range a {
		a[i], b[i] = float32(i), float32(2*i)
	}
	for io, data := range [][]byte{core.EncodeF32(a), core.EncodeF32(b), make([]byte, 64)} {
		buf, ok := c.buffer(ctx, 64)
		if !ok {
			return
		}
		c.must("buffer_write", buf, c.p.BufferWrite(buf, 0, data))
		c.must(fmt.Sprintf("execution_bind(%d)", io), ex, c.p.ExecutionBind(ex, uint32(io), buf, 0))
		c.added.bufs[io] = buf
	}
}

// checkAdd reads the output of bindAdd's execution: 3i.
func (c *abiCheck) checkAdd() {
	out := make([]byte, 64)
	if !c.must("buffer_read", c.added.bufs[2], c.p.BufferRead(c.added.bufs[2], 0, out)) {
		return
	}
	for i, v := range core.DecodeF32(out) {
		if v != float32(3*i) {
			c.res.fail(CatMismatch, "ADD output %d is %g, want %d", i, v, 3*i)
			return
		}
	}
}

func (c *abiCheck) releaseInFlight() {
	async, ok := c.async()
	if !ok {
		return
	}
	if !async {
		// a synchronous submit would wait for the host's signal before returning: nothing can be
		// in flight when it returns
		c.res.Status, c.res.Reason = StatusUnsupported, "the device is synchronous (no async cap): nothing is ever in flight"
		return
	}
	_, exs, gate, done, ok := c.gatedAdd(1)
	if !ok {
		return
	}
	ex := exs[0]
	// the execution waits on a fence only the host signals: it is in flight until then
	if !c.must("execution_submit(waiting on the host)", ex, c.p.ExecutionSubmit(ex,
		[]abi.FencePoint{{Fence: gate, Value: 1}}, &abi.FencePoint{Fence: done, Value: 1})) {
		return
	}
	c.expect("execution_release while in flight", ex, c.p.ExecutionRelease(ex), abi.StatusBadState)
	c.expect("buffer_release of a bound buffer while in flight", c.added.bufs[2], c.p.BufferRelease(c.added.bufs[2]), abi.StatusBadState)
	c.expect("execution_submit while in flight", ex, c.p.ExecutionSubmit(ex, nil, nil), abi.StatusBadState)
	c.expect("fence_wait(not yet, 1 ms)", done, c.p.FenceWait(done, 1, time.Millisecond), abi.StatusTimeout)
	c.expect("fence_signal(gate)", gate, c.p.FenceSignal(gate, 1), abi.StatusOK)
	c.expect("fence_wait(done)", done, c.p.FenceWait(done, 1, 30*time.Second), abi.StatusOK)
	c.checkAdd()
}

// fenceChain: a submission gated on a host-signalled fence does not run before the signal, and
// a second one, reading the first's output and waiting on the first's signal, runs after it with
// no host call in between (the first's output, 3i, plus 2i: 5i). A synchronous device (no async
// cap) runs a submission before submit returns: its gate opens first.
func (c *abiCheck) fenceChain() {
	async, ok := c.async()
	if !ok {
		return
	}
	ctx, exs, gate, done, ok := c.gatedAdd(2)
	if !ok {
		return
	}
	x1, x2 := exs[0], exs[1]
	b, out := make([]float32, 16), make([]byte, 64)
	for i := range b {
		b[i] = float32(2 * i)
	}
	second := [3]uint64{c.added.bufs[2]}
	for io, data := range [][]byte{nil, core.EncodeF32(b), out} {
		if io > 0 {
			buf, ok := c.buffer(ctx, 64)
			if !ok {
				return
			}
			c.must("buffer_write", buf, c.p.BufferWrite(buf, 0, data))
			second[io] = buf
		}
		c.must(fmt.Sprintf("execution_bind(%d) of the second", io), x2, c.p.ExecutionBind(x2, uint32(io), second[io], 0))
	}
	if c.fatal {
		return
	}
	if !async {
		c.expect("fence_signal(gate)", gate, c.p.FenceSignal(gate, 1), abi.StatusOK)
	}
	if !c.must("execution_submit(first, waiting on the host)", x1, c.p.ExecutionSubmit(x1,
		[]abi.FencePoint{{Fence: gate, Value: 1}}, &abi.FencePoint{Fence: done, Value: 1})) {
		return
	}
	if !c.must("execution_submit(second, waiting on the first)", x2, c.p.ExecutionSubmit(x2,
		[]abi.FencePoint{{Fence: done, Value: 1}}, &abi.FencePoint{Fence: done, Value: 2})) {
		c.p.FenceSignal(gate, 1)
		return
	}
	if async {
		c.expect("fence_wait(the chain before the gate opened, 50 ms)", done, c.p.FenceWait(done, 2, 50*time.Millisecond), abi.StatusTimeout)
		c.expect("fence_signal(gate)", gate, c.p.FenceSignal(gate, 1), abi.StatusOK)
	}
	if !c.expect("fence_wait(the chain's end)", done, c.p.FenceWait(done, 2, 30*time.Second), abi.StatusOK) {
		return
	}
	if !c.must("buffer_read", second[2], c.p.BufferRead(second[2], 0, out)) {
		return
	}
	for i, v := range core.DecodeF32(out) {
		if v != float32(5*i) {
			c.res.fail(CatMismatch, "the chained ADD's output %d is %g, want %d", i, v, 5*i)
			return
		}
	}
}

// async says whether the device runs submissions after submit returns (the async cap).
func (c *abiCheck) async() (async, ok bool) {
	di, st := c.p.DeviceInfo(c.dev)
	if !c.must("device_info", 0, st) {
		return false, false
	}
	return di.Caps.Has(core.CapAsync), true
}

// gatedAdd is the setup of the gated-submission cases: a context, the ADD executable, n
// executions of it (the first bound by bindAdd) and the fences of gateAndDone.
func (c *abiCheck) gatedAdd(n int) (ctx uint64, exs []uint64, gate, done uint64, ok bool) {
	if ctx, ok = c.context(); !ok {
		return
	}
	exe, ok := c.executable(ctx)
	if !ok {
		return
	}
	for range n {
		ex, ok := c.execution(exe)
		if !ok {
			return ctx, nil, 0, 0, false
		}
		exs = append(exs, ex)
	}
	if gate, done, ok = c.gateAndDone(ctx); !ok {
		return
	}
	c.bindAdd(ctx, exs[0])
	return ctx, exs, gate, done, !c.fatal
}

// gateAndDone makes two fences at 0 on ctx: one only the host signals, one a submission does.
func (c *abiCheck) gateAndDone(ctx uint64) (gate, done uint64, ok bool) {
	gate, st1 := c.p.FenceCreate(ctx, 0)
	done, st2 := c.p.FenceCreate(ctx, 0)
	if !c.must("fence_create", ctx, st1) || !c.must("fence_create", ctx, st2) {
		return 0, 0, false
	}
	c.undo = append(c.undo, func() { c.p.FenceRelease(gate); c.p.FenceRelease(done) })
	return gate, done, true
}
