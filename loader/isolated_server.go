package loader

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/core"
)

// The child side of an isolated backend: `xpu plugin-host <plugin>` opens the plugin through
// purego and serves its function table over go-plugin's gRPC.

// handshake: ProtocolVersion is protocolVersion (ABI major and wire revision), so a host and a
// plugin host of another xpu build whose wire formats differ refuse each other at the handshake
// (versionMismatch turns go-plugin's complaint into a clear error). The cookie only stops `xpu
// plugin-host` from being run by hand by mistake; it is no security boundary.
var handshake = plugin.HandshakeConfig{
	ProtocolVersion:  protocolVersion,
	MagicCookieKey:   "XPU_PLUGIN_HOST_COOKIE",
	MagicCookieValue: "2b0c1f6e-xpu-isolated-backend",
}

// pluginSetName is the one plugin a plugin host dispenses.
const pluginSetName = "backend"

// fdSocketFD is the child's end of the fd socket pair: the first of exec.Cmd.ExtraFiles.
const fdSocketFD = 3

type grpcBackendPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	srv *hostServer
}

func (g *grpcBackendPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	s.RegisterService(&backendService, g.srv)
	return nil
}

func (g *grpcBackendPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, cc *grpc.ClientConn) (any, error) {
	return cc, nil
}

// ServePluginHost is the body of `xpu plugin-host <plugin file>`: it opens the plugin in this
// process and serves it to the parent until the parent kills it or closes the connection. It
// returns only on failure to start.
func ServePluginHost(path string) error {
	if os.Getenv(handshake.MagicCookieKey) != handshake.MagicCookieValue {
		return fmt.Errorf("plugin-host is started by the xpu loader for isolated backends, not by hand: %w",
			core.ErrInvalidArgument)
	}
	sock := os.NewFile(fdSocketFD, "xpu-fd-socket")
	if sock == nil {
		return fmt.Errorf("plugin-host: fd %d (the fd socket) is missing: %w", fdSocketFD, core.ErrInvalidArgument)
	}
	srv := &hostServer{ctxDev: map[uint64]uint32{},
		bufs: map[uint64]*childBuf{}, exeInputs: map[uint64]int{}, execs: map[uint64]*childExec{}}
	srv.fds = newFDReceiver(sock)
	// A plugin that fails to open is still served: the parent's first call (opInfo) gets the
	// reason with its status. Exiting instead would leave the parent only go-plugin's guess at
	// why a child printed no handshake ("not compiled for this architecture").
	p, err := abi.Open(path)
	if err == nil {
		srv.p = p
		err = srv.loadDevices()
	}
	srv.openErr = err
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: handshake,
		Plugins:         plugin.PluginSet{pluginSetName: &grpcBackendPlugin{srv: srv}},
		GRPCServer:      plugin.DefaultGRPCServer,
		Logger:          hclog.NewNullLogger(),
	})
	return nil
}

// childBuf is a shared-memory buffer as the child sees it. staged: the plugin can import
// neither host memory nor fds, so the plugin has its own buffer and the bytes are copied
// between it and the shared memory around every execution (inside this process, never over
// the rpc).
type childBuf struct {
	mem    *shm
	ctx    uint64
	staged bool
}

type childExec struct {
	exe   uint64
	binds map[uint32]uint64 // io -> buffer
}

type hostServer struct {
	p       *abi.Plugin
	openErr error // why the plugin could not be opened: every call answers it
	fds     *fdReceiver
	devs    []core.DeviceInfo

	mu        sync.Mutex
	ring      *ring
	ctxDev    map[uint64]uint32
	bufs      map[uint64]*childBuf
	exeInputs map[uint64]int
	execs     map[uint64]*childExec
}

func (s *hostServer) loadDevices() error {
	n, st := s.p.DeviceCount()
	if st != abi.StatusOK {
		return s.p.Err("device_count", 0, st)
	}
	for i := range n {
		d, st := s.p.DeviceInfo(i)
		if st != abi.StatusOK {
			return s.p.Err("device_info", 0, st)
		}
		s.devs = append(s.devs, d)
	}
	return nil
}

// isoInfo is what opInfo answers (JSON: asked once per child).
type isoInfo struct {
	Probe   abi.ProbeResult
	Info    abi.PluginInfo
	Devices []core.DeviceInfo
}

func fail(st abi.Status, msg string) *rpcResp { return &rpcResp{Status: int32(st), S: msg} }

// onOK updates the server's own record of the plugin's objects (f, under s.mu) when the call that
// returned st succeeded: the record follows only what the plugin did.
func (s *hostServer) onOK(st abi.Status, f func()) {
	if st == abi.StatusOK {
		s.mu.Lock()
		f()
		s.mu.Unlock()
	}
}

func (s *hostServer) result(st abi.Status, h uint64, u ...uint64) *rpcResp {
	if st != abi.StatusOK {
		return fail(st, s.p.LastError(h))
	}
	r := &rpcResp{}
	copy(r.U[:], u)
	return r
}

// statusOf is the status whose sentinel err wraps (XPU_E_INTERNAL for none).
func statusOf(err error) abi.Status {
	for st := abi.StatusUnsupported; st >= abi.StatusInternal; st-- {
		if errors.Is(err, st.Sentinel()) {
			return st
		}
	}
	return abi.StatusInternal
}

func (s *hostServer) handle(_ context.Context, q *rpcReq) *rpcResp {
	if s.openErr != nil {
		return fail(statusOf(s.openErr), s.openErr.Error())
	}
	p := s.p
	u := q.U
	switch q.Op {
	case opInfo:
		b, err := json.Marshal(isoInfo{Probe: p.ProbeResult(), Info: p.Info(), Devices: s.devs})
		if err != nil {
			return fail(abi.StatusInternal, err.Error())
		}
		return &rpcResp{B: b}
	case opOpSupport:
		v, st := p.OpSupport(uint32(u[0]), core.OpQuery{Op: core.Op(u[1]), DTypeIn: core.DType(u[2]),
			DTypeWeight: core.DType(u[3]), DTypeOut: core.DType(u[4]), Rank: int(u[5])})
		return s.result(st, 0, uint64(v))
	case opContextCreate:
		h, st := p.ContextCreate(uint32(u[0]), q.S)
		s.onOK(st, func() { s.ctxDev[h] = uint32(u[0]) })
		return s.result(st, 0, h)
	case opContextRelease:
		st := p.ContextRelease(u[0])
		s.onOK(st, func() { delete(s.ctxDev, u[0]) })
		return s.result(st, u[0])
	case opBufferAlloc:
		return s.bufferNew(u[0], u[3], 0, u[1], uint32(u[2]))
	case opBufferImportFD:
		return s.bufferNew(u[0], u[3], u[1], u[2], uint32(core.BufferDevice))
	case opBufferRelease:
		st := p.BufferRelease(u[0])
		s.onOK(st, func() {
			if b := s.bufs[u[0]]; b != nil {
				b.mem.close()
				delete(s.bufs, u[0])
			}
		})
		return s.result(st, u[0])
	case opAnalyze:
		vs, st := p.GraphAnalyze(u[0], q.B, uint32(u[1]))
		if st != abi.StatusOK {
			return s.result(st, u[0])
		}
		b, err := json.Marshal(vs)
		if err != nil {
			return fail(abi.StatusInternal, err.Error())
		}
		return &rpcResp{B: b}
	case opPrepare:
		if err := s.syncConsts(q.B); err != nil {
			return fail(abi.StatusInternal, err.Error())
		}
		h, st := p.GraphPrepare(u[0], q.B, q.S, q.C)
		if len(q.B) >= 24 {
			s.onOK(st, func() { s.exeInputs[h] = int(binary.LittleEndian.Uint32(q.B[20:])) })
		}
		return s.result(st, u[0], h)
	case opSerialize:
		blob, st := p.ExecutableSerialize(u[0])
		if st != abi.StatusOK {
			return s.result(st, u[0])
		}
		return &rpcResp{B: blob}
	case opExecutableRelease:
		st := p.ExecutableRelease(u[0])
		s.onOK(st, func() { delete(s.exeInputs, u[0]) })
		return s.result(st, u[0])
	case opExecutionCreate:
		h, st := p.ExecutionCreate(u[0])
		s.onOK(st, func() { s.execs[h] = &childExec{exe: u[0], binds: map[uint32]uint64{}} })
		return s.result(st, u[0], h)
	case opExecutionBind:
		st := p.ExecutionBind(u[0], uint32(u[1]), u[2], u[3])
		s.onOK(st, func() {
			if x := s.execs[u[0]]; x != nil {
				x.binds[uint32(u[1])] = u[2]
			}
		})
		return s.result(st, u[0])
	case opExecutionSubmit:
		return s.submit(q)
	case opExecutionRun:
		if st, msg := s.stage(u[0], true); st != abi.StatusOK {
			return fail(st, msg)
		}
		st := p.ExecutionRun(u[0])
		if st == abi.StatusOK {
			if st, msg := s.stage(u[0], false); st != abi.StatusOK {
				return fail(st, msg)
			}
		}
		return s.result(st, u[0])
	case opExecutionRelease:
		st := p.ExecutionRelease(u[0])
		s.onOK(st, func() { delete(s.execs, u[0]) })
		return s.result(st, u[0])
	case opFenceCreate:
		h, st := p.FenceCreate(u[0], u[1])
		return s.result(st, u[0], h)
	case opFenceWait:
		return s.result(p.FenceWait(u[0], u[1], durationNS(u[2])), u[0])
	case opFenceValue:
		v, st := p.FenceValue(u[0])
		return s.result(st, u[0], v)
	case opFenceSignal:
		return s.result(p.FenceSignal(u[0], u[1]), u[0])
	case opFenceRelease:
		return s.result(p.FenceRelease(u[0]), u[0])
	case opRingAttach:
		return s.attachRing(u[0])
	case opShutdown:
		if err := p.Close(); err != nil {
			return fail(abi.StatusBadState, err.Error())
		}
		return &rpcResp{}
	}
	return fail(abi.StatusInvalidArg, fmt.Sprintf("plugin-host: unknown operation %d", q.Op))
}

// attachRing maps the run ring whose memfd came with fdID and starts serving it.
func (s *hostServer) attachRing(fdID uint64) *rpcResp {
	fd, err := s.fds.take(fdID)
	if err != nil {
		return fail(abi.StatusInternal, "plugin-host: "+err.Error())
	}
	r, err := attachRing(fd)
	if err != nil {
		closeFD(fd)
		return fail(statusOf(err), "plugin-host: "+err.Error())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ring != nil {
		r.mem.close()
		return fail(abi.StatusBadState, "plugin-host: the run ring is attached already")
	}
	s.ring = r
	// The last request seen is read here, before the answer lets the host post: read in the
	// goroutine, it could already be the host's first request, which would then never be
	// served (the host waited on it forever; seen under load in TestIsolatedChildKilledWhileHostSleeps).
	go s.serveRing(r, atomic.LoadUint32(r.reqSeq))
	return &rpcResp{}
}

// serveRing serves the calls made on the ring after request last, one at a time, for the
// process's life (the parent kills the process; there is no other way out).
func (s *hostServer) serveRing(r *ring, last uint32) {
	for {
		seq := r.next(last)
		q := r.request()
		var resp *rpcResp
		if ringable(q) {
			resp = s.handle(context.Background(), q)
		} else {
			resp = fail(abi.StatusInvalidArg, fmt.Sprintf("plugin-host: operation %d cannot go on the run ring", q.Op))
		}
		r.answer(seq, resp)
		last = seq
	}
}

// bufferNew maps the fd sent with fdID and makes the plugin buffer over it: zero-copy where
// the device imports host memory or fds, a staged plugin buffer otherwise.
func (s *hostServer) bufferNew(ctx, fdID, offset, size uint64, kind uint32) *rpcResp {
	fd, err := s.fds.take(fdID)
	if err != nil {
		return fail(abi.StatusInternal, "plugin-host: "+err.Error())
	}
	mem, err := mapShmRange(fd, int64(offset), int64(size))
	if err != nil {
		closeFD(fd)
		return fail(abi.StatusInvalidArg, "plugin-host: "+err.Error())
	}
	s.mu.Lock()
	dev, ok := s.ctxDev[ctx]
	s.mu.Unlock()
	var caps core.Caps
	if ok && int(dev) < len(s.devs) {
		caps = s.devs[dev].Caps
	}
	var h uint64
	st := abi.StatusUnsupported
	staged := false
	switch {
	case caps.Has(core.CapImportHost):
		h, st = s.p.BufferImportHost(ctx, mem.view)
	case caps.Has(core.CapImportFD):
		h, st = s.p.BufferImportFD(ctx, fd, offset, size)
	}
	if st == abi.StatusUnsupported {
		h, st = s.p.BufferAlloc(ctx, size, kind)
		staged = true
	}
	if st != abi.StatusOK {
		mem.close()
		return s.result(st, ctx)
	}
	s.mu.Lock()
	s.bufs[h] = &childBuf{mem: mem, ctx: ctx, staged: staged}
	s.mu.Unlock()
	return &rpcResp{U: [2]uint64{h}}
}

// syncConsts pushes the shared bytes of staged constant buffers to the plugin before prepare
// (plugins may repack weights at prepare).
func (s *hostServer) syncConsts(ir []byte) error {
	const hdr, rec = 32, 64
	if len(ir) < hdr {
		return nil // the plugin's parser reports the bad IR
	}
	n := int(binary.LittleEndian.Uint32(ir[12:]))
	for i := 0; i < n && hdr+(i+1)*rec <= len(ir); i++ {
		r := ir[hdr+i*rec:]
		if binary.LittleEndian.Uint32(r[40:]) != uint32(core.KindConst) {
			continue
		}
		h := binary.LittleEndian.Uint64(r[48:])
		s.mu.Lock()
		b := s.bufs[h]
		s.mu.Unlock()
		if b != nil && b.staged {
			if st := s.p.BufferWrite(h, 0, b.mem.view); st != abi.StatusOK {
				return s.p.Err("buffer_write", h, st)
			}
		}
	}
	return nil
}

// stage copies staged buffers bound to ex: in (before a run) every bound buffer from shared
// memory to the plugin, out (after) the outputs back.
func (s *hostServer) stage(ex uint64, in bool) (abi.Status, string) {
	s.mu.Lock()
	x := s.execs[ex]
	var todo []uint64
	if x != nil {
		nIn := s.exeInputs[x.exe]
		for io, h := range x.binds {
			if b := s.bufs[h]; b != nil && b.staged && (in || int(io) >= nIn) {
				todo = append(todo, h)
			}
		}
	}
	s.mu.Unlock()
	for _, h := range todo {
		s.mu.Lock()
		b := s.bufs[h]
		s.mu.Unlock()
		if b == nil {
			continue
		}
		var st abi.Status
		if in {
			st = s.p.BufferWrite(h, 0, b.mem.view)
		} else {
			st = s.p.BufferRead(h, 0, b.mem.view)
		}
		if st != abi.StatusOK {
			return st, s.p.LastError(h)
		}
	}
	return abi.StatusOK, ""
}

// submit forwards execution_submit. With staged buffers the copies must surround the run, so
// the submission runs synchronously here: wait, run, copy out, signal.
func (s *hostServer) submit(q *rpcReq) *rpcResp {
	ex := q.U[0]
	var signal *abi.FencePoint
	if q.U[1] != 0 {
		signal = &abi.FencePoint{Fence: q.U[2], Value: q.U[3]}
	}
	if !s.hasStaged(ex) {
		return s.result(s.p.ExecutionSubmit(ex, q.F, signal), ex)
	}
	for _, w := range q.F {
		if st := s.p.FenceWait(w.Fence, w.Value, -1); st != abi.StatusOK {
			return s.result(st, w.Fence)
		}
	}
	if st, msg := s.stage(ex, true); st != abi.StatusOK {
		return fail(st, msg)
	}
	if st := s.p.ExecutionRun(ex); st != abi.StatusOK {
		return s.result(st, ex)
	}
	if st, msg := s.stage(ex, false); st != abi.StatusOK {
		return fail(st, msg)
	}
	if signal != nil {
		return s.result(s.p.FenceSignal(signal.Fence, signal.Value), signal.Fence)
	}
	return &rpcResp{}
}

func (s *hostServer) hasStaged(ex uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if x := s.execs[ex]; x != nil {
		for _, h := range x.binds {
			if b := s.bufs[h]; b != nil && b.staged {
				return true
			}
		}
	}
	return false
}
