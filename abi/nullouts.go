package abi

import (
	"unsafe"

	"github.com/xpuhub/xpu/core"
)

// CallWithNullOutputs calls every table entry that takes a pointer argument with NULL in that
// argument (on otherwise valid handles it makes for the purpose, on device 0) and returns each
// status, keyed "entry" or "entry.argument". A conforming plugin answers StatusInvalidArg to
// every one (executable_serialize may answer StatusUnsupported) and never crashes. Entries whose
// setup failed (no device, a graph of one RELU it cannot prepare, ...) are left out of the map.
func (p *Plugin) CallWithNullOutputs() map[string]Status {
	res := map[string]Status{}
	call := func(key, entry string, present bool, f func() int32) {
		if present {
			res[key] = p.call(entry, true, f)
		}
	}
	fn := &p.fn
	call("get_info", "get_info", fn.getInfo != nil, func() int32 { return fn.getInfo(nil) })
	call("last_error.buf", "last_error", fn.lastError != nil, func() int32 { return fn.lastError(0, nil, 16, nil) })
	call("device_count", "device_count", fn.deviceCount != nil, func() int32 { return fn.deviceCount(nil) })
	call("device_info", "device_info", fn.deviceInfo != nil, func() int32 { return fn.deviceInfo(0, nil) })
	q := cOpQuery{Op: uint32(core.OpReLU), DTypeIn: uint32(core.F32), DTypeOut: uint32(core.F32), Rank: 1}
	q.StructSize = uint32(unsafe.Sizeof(q))
	var verdict uint32
	call("op_support.query", "op_support", fn.opSupport != nil, func() int32 { return fn.opSupport(0, nil, &verdict) })
	call("op_support.verdict", "op_support", fn.opSupport != nil, func() int32 { return fn.opSupport(0, &q, nil) })
	call("context_create", "context_create", fn.ctxCreate != nil, func() int32 { return fn.ctxCreate(0, nil, nil) })

	ctx, st := p.ContextCreate(0, "")
	if st != StatusOK {
		return res
	}
	defer p.ContextRelease(ctx)
	call("buffer_alloc", "buffer_alloc", fn.bufAlloc != nil, func() int32 { return fn.bufAlloc(ctx, 64, 0, nil) })
	call("buffer_import.desc", "buffer_import", fn.bufImport != nil, func() int32 {
		var out uint64
		return fn.bufImport(ctx, nil, &out)
	})
	call("fence_create", "fence_create", fn.fenceCreate != nil, func() int32 { return fn.fenceCreate(ctx, 0, nil) })
	if f, st := p.FenceCreate(ctx, 0); st == StatusOK {
		call("fence_value", "fence_value", fn.fenceValue != nil, func() int32 { return fn.fenceValue(f, nil) })
		p.FenceRelease(f)
	}

	buf, st := p.BufferAlloc(ctx, 64, uint32(core.BufferDevice))
	if st != StatusOK {
		return res
	}
	defer p.BufferRelease(buf)
	call("buffer_map", "buffer_map", fn.bufMap != nil, func() int32 { return fn.bufMap(buf, nil) })
	call("buffer_size", "buffer_size", fn.bufSize != nil, func() int32 { return fn.bufSize(buf, nil) })
	call("buffer_write.src", "buffer_write", fn.bufWrite != nil, func() int32 { return fn.bufWrite(buf, 0, nil, 4) })
	call("buffer_read.dst", "buffer_read", fn.bufRead != nil, func() int32 { return fn.bufRead(buf, 0, nil, 4) })

	g := core.NewGraph()
	g.Output(g.ReLU(g.Input("x", core.F32, 16)))
	ir, err := EncodeGraph(g, nil)
	if err != nil {
		return res
	}
	call("graph_analyze.ir", "graph_analyze", fn.analyze != nil, func() int32 {
		var v [1]cNodeVerdict
		v[0].StructSize = uint32(unsafe.Sizeof(v[0]))
		return fn.analyze(ctx, nil, uint64(len(ir)), &v[0], 1)
	})
	call("graph_analyze.out", "graph_analyze", fn.analyze != nil, func() int32 {
		return fn.analyze(ctx, unsafe.Pointer(&ir[0]), uint64(len(ir)), nil, 1)
	})
	call("graph_prepare.desc", "graph_prepare", fn.prepare != nil, func() int32 {
		var out uint64
		return fn.prepare(ctx, nil, &out)
	})
	call("graph_prepare.out", "graph_prepare", fn.prepare != nil, func() int32 {
		d := cPrepareDesc{IR: unsafe.Pointer(&ir[0]), IRSize: uint64(len(ir))}
		d.StructSize = uint32(unsafe.Sizeof(d))
		return fn.prepare(ctx, &d, nil)
	})
	call("graph_prepare.ir", "graph_prepare", fn.prepare != nil, func() int32 {
		d := cPrepareDesc{IRSize: uint64(len(ir))}
		d.StructSize = uint32(unsafe.Sizeof(d))
		var out uint64
		return fn.prepare(ctx, &d, &out)
	})

	exe, st := p.GraphPrepare(ctx, ir, "", nil)
	if st != StatusOK {
		return res
	}
	defer p.ExecutableRelease(exe)
	call("executable_serialize", "executable_serialize", fn.serialize != nil, func() int32 {
		return fn.serialize(exe, nil, 0, nil)
	})
	call("execution_create", "execution_create", fn.exCreate != nil, func() int32 { return fn.exCreate(exe, nil) })
	if ex, st := p.ExecutionCreate(exe); st == StatusOK {
		call("execution_submit.waits", "execution_submit", fn.exSubmit != nil, func() int32 {
			return fn.exSubmit(ex, nil, 1, nil)
		})
		p.ExecutionRelease(ex)
	}
	return res
}
