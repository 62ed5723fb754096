package loader

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/core"
)

// isoCalls is abi.Calls over one child process: each entry is a call on the run ring or an
// rpc, and the one core.Backend adapter of package abi sits on top, as it does in process.
// What differs from a plugin in this process lives here: buffers are shared memory (memfd)
// mapped by both processes, so that reads, writes and maps touch the pages without a call;
// a run has a deadline past which the child is killed; and releases in a dead child succeed,
// freeing only this side's memory.
type isoCalls struct {
	pr          *isoProc
	name, path  string
	execTimeout time.Duration

	bufMu sync.Mutex
	bufs  map[uint64]*shm // each live buffer's shared memory, by plugin handle
}

var _ abi.Calls = (*isoCalls)(nil)

func newIsoCalls(pr *isoProc, cfg *config, cd Candidate) *isoCalls {
	return &isoCalls{pr: pr, name: cd.Name, path: cd.Path, execTimeout: cfg.execTimeout,
		bufs: map[uint64]*shm{}}
}

// release calls a release entry, unless the child is gone: then there is nothing to release.
func (c *isoCalls) release(entry string, op uint32, h uint64) error {
	if c.pr.deadErr() != nil {
		return nil
	}
	_, err := c.pr.callTimed(entry, &rpcReq{Op: op, U: [6]uint64{h}})
	return err
}

// value calls an entry that answers one integer (a handle, a value).
func (c *isoCalls) value(entry string, req *rpcReq) (uint64, error) {
	resp, err := c.pr.callTimed(entry, req)
	if err != nil {
		return 0, err
	}
	return resp.U[0], nil
}

func (c *isoCalls) OpSupport(dev uint32, q core.OpQuery) (core.Verdict, error) {
	v, err := c.value("op_support", &rpcReq{Op: opOpSupport, U: [6]uint64{uint64(dev), uint64(q.Op),
		uint64(q.DTypeIn), uint64(q.DTypeWeight), uint64(q.DTypeOut), uint64(q.Rank)}})
	return core.Verdict(v), err
}

func (c *isoCalls) ContextCreate(ctx context.Context, dev uint32, opts string) (uint64, error) {
	resp, err := c.pr.call(ctx, "context_create", &rpcReq{Op: opContextCreate, U: [6]uint64{uint64(dev)}, S: opts})
	if err != nil {
		return 0, err
	}
	return resp.U[0], nil
}

func (c *isoCalls) ContextRelease(cx uint64) error {
	return c.release("context_release", opContextRelease, cx)
}

// newBuffer passes mem's fd to the child, which makes the plugin buffer over the same pages
// (op with arguments cx, u1, u2 and the fd's id). It owns mem: on failure it is unmapped.
func (c *isoCalls) newBuffer(mem *shm, op uint32, cx, u1, u2 uint64) (uint64, error) {
	if err := c.pr.deadErr(); err != nil {
		mem.close()
		return 0, err
	}
	id, err := c.pr.fds.send(mem.fd)
	if err != nil {
		mem.close()
		return 0, c.pr.crashed(err)
	}
	// the child has its own fd now; the mapping keeps the pages for this side
	unix.Close(mem.fd)
	mem.fd = -1
	h, err := c.value("buffer_alloc", &rpcReq{Op: op, U: [6]uint64{cx, u1, u2, id}})
	if err != nil {
		mem.close()
		return 0, err
	}
	c.bufMu.Lock()
	c.bufs[h] = mem
	c.bufMu.Unlock()
	return h, nil
}

func (c *isoCalls) BufferAlloc(cx, size uint64, kind core.BufferKind) (uint64, error) {
	if size > 1<<62 {
		return 0, fmt.Errorf("isolated %s: alloc %d bytes: %w", c.name, size, core.ErrInvalidArgument)
	}
	mem, err := newShm(int64(size))
	if err != nil {
		return 0, fmt.Errorf("isolated %s: alloc: %w", c.name, err)
	}
	return c.newBuffer(mem, opBufferAlloc, cx, size, uint64(kind))
}

func (c *isoCalls) BufferImportHost(uint64, []byte) (uint64, error) {
	return 0, fmt.Errorf("isolated %s: host memory cannot be shared with the plugin process (use Alloc or ImportFD): %w",
		c.name, core.ErrUnsupported)
}

func (c *isoCalls) BufferImportFD(cx uint64, fd int, offset, size uint64) (uint64, error) {
	if err := c.pr.deadErr(); err != nil {
		return 0, err
	}
	if offset > 1<<62 || size > 1<<62 {
		return 0, fmt.Errorf("isolated %s: import fd [%d,+%d): %w", c.name, offset, size, core.ErrInvalidArgument)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("isolated %s: dup fd %d: %v: %w", c.name, fd, err, core.ErrInvalidArgument)
	}
	mem, err := mapShmRange(dup, int64(offset), int64(size))
	if err != nil {
		unix.Close(dup)
		return 0, fmt.Errorf("isolated %s: import fd: %w", c.name, err)
	}
	return c.newBuffer(mem, opBufferImportFD, cx, offset, size)
}

// view is [offset, offset+n) of buffer buf's shared pages.
func (c *isoCalls) view(entry string, buf, offset uint64, n int) ([]byte, error) {
	c.bufMu.Lock()
	mem := c.bufs[buf]
	c.bufMu.Unlock()
	if mem == nil {
		return nil, fmt.Errorf("isolated %s %s: %w", c.name, entry, abi.StatusInvalidHandle.Err("no such buffer"))
	}
	size := uint64(len(mem.view))
	if offset > size || uint64(n) > size-offset {
		return nil, fmt.Errorf("isolated %s %s: [%d,+%d) outside a %d-byte buffer: %w", c.name, entry, offset, n,
			size, core.ErrInvalidArgument)
	}
	return mem.view[offset : offset+uint64(n)], nil
}

// BufferWrite, BufferRead and BufferMap touch the shared pages directly: no call, no copy
// through the child.
func (c *isoCalls) BufferWrite(buf, offset uint64, src []byte) error {
	dst, err := c.view("buffer_write", buf, offset, len(src))
	if err == nil {
		copy(dst, src)
	}
	return err
}

func (c *isoCalls) BufferRead(buf, offset uint64, dst []byte) error {
	src, err := c.view("buffer_read", buf, offset, len(dst))
	if err == nil {
		copy(dst, src)
	}
	return err
}

func (c *isoCalls) BufferMap(buf uint64) ([]byte, error) {
	c.bufMu.Lock()
	mem := c.bufs[buf]
	c.bufMu.Unlock()
	if mem == nil {
		return nil, fmt.Errorf("isolated %s buffer_map: %w", c.name, abi.StatusInvalidHandle.Err("no such buffer"))
	}
	return mem.view, nil
}

func (c *isoCalls) BufferUnmap(buf uint64) error {
	_, err := c.view("buffer_unmap", buf, 0, 0)
	return err
}

func (c *isoCalls) BufferRelease(buf uint64) error {
	// forgotten before the call, so that a handle the plugin reuses at once is not forgotten
	// after it; put back if the plugin refuses
	c.bufMu.Lock()
	mem := c.bufs[buf]
	delete(c.bufs, buf)
	c.bufMu.Unlock()
	if err := c.release("buffer_release", opBufferRelease, buf); err != nil {
		if mem != nil {
			c.bufMu.Lock()
			c.bufs[buf] = mem
			c.bufMu.Unlock()
		}
		return err
	}
	if mem != nil {
		mem.close()
	}
	return nil
}

func (c *isoCalls) GraphAnalyze(ctx context.Context, cx uint64, ir []byte, n uint32) ([]abi.RawVerdict, error) {
	resp, err := c.pr.call(ctx, "graph_analyze", &rpcReq{Op: opAnalyze, U: [6]uint64{cx, uint64(n)}, B: ir})
	if err != nil {
		return nil, err
	}
	var raw []abi.RawVerdict
	if err := json.Unmarshal(resp.B, &raw); err != nil {
		return nil, fmt.Errorf("isolated %s graph_analyze: bad answer (%v): %w", c.name, err, core.ErrInternal)
	}
	return raw, nil
}

func (c *isoCalls) GraphPrepare(ctx context.Context, cx uint64, ir []byte, opts string, cache []byte) (uint64, error) {
	resp, err := c.pr.call(ctx, "graph_prepare", &rpcReq{Op: opPrepare, U: [6]uint64{cx}, B: ir, S: opts, C: cache})
	if err != nil {
		return 0, err
	}
	return resp.U[0], nil
}

func (c *isoCalls) ExecutableSerialize(exe uint64) ([]byte, error) {
	resp, err := c.pr.callTimed("executable_serialize", &rpcReq{Op: opSerialize, U: [6]uint64{exe}})
	if err != nil {
		return nil, err
	}
	return resp.B, nil
}

func (c *isoCalls) ExecutableRelease(exe uint64) error {
	return c.release("executable_release", opExecutableRelease, exe)
}

func (c *isoCalls) ExecutionCreate(exe uint64) (uint64, error) {
	return c.value("execution_create", &rpcReq{Op: opExecutionCreate, U: [6]uint64{exe}})
}

func (c *isoCalls) ExecutionBind(ex uint64, io uint32, buf, offset uint64) error {
	_, err := c.pr.callTimed("execution_bind", &rpcReq{Op: opExecutionBind, U: [6]uint64{ex, uint64(io), buf, offset}})
	return err
}

func (c *isoCalls) ExecutionSubmit(ex uint64, waits []abi.FencePoint, signal *abi.FencePoint) error {
	req := &rpcReq{Op: opExecutionSubmit, U: [6]uint64{ex}, F: waits}
	if signal != nil {
		req.U[1], req.U[2], req.U[3] = 1, signal.Fence, signal.Value
	}
	_, err := c.pr.callTimed("execution_submit", req)
	return err
}

// ExecutionRun is one request on the shared-memory run ring (or one small rpc while another
// run is in flight): the bytes are already in the shared buffers.
//
// A run has a deadline (WithExecuteTimeout, or automatic from hist): a plugin still inside
// execution_run then is killed and the run fails with core.ErrTimeout and
// core.ErrBackendCrashed.
func (c *isoCalls) ExecutionRun(ctx context.Context, ex uint64, hist *abi.RunHistory) error {
	longest := hist.Longest()
	limit := execDeadline(c.execTimeout, longest)
	timeout := &execTimeoutError{name: c.name, path: c.path, limit: limit, longest: longest,
		fixed: c.execTimeout > 0}
	pr := c.pr
	start := time.Now()
	_, ok, expired, err := pr.ringCall(ctx, "execution_run", &rpcReq{Op: opExecutionRun, U: [6]uint64{ex}},
		start.Add(limit))
	if expired {
		return pr.overdue(timeout)
	}
	if !ok {
		ctx, cancel := context.WithTimeoutCause(ctx, limit, timeout)
		defer cancel()
		_, err = pr.rpc(ctx, "execution_run", &rpcReq{Op: opExecutionRun, U: [6]uint64{ex}})
	}
	if err == nil {
		hist.Record(time.Since(start))
	}
	return err
}

func (c *isoCalls) ExecutionRelease(ex uint64) error {
	return c.release("execution_release", opExecutionRelease, ex)
}

func (c *isoCalls) FenceCreate(cx, initial uint64) (uint64, error) {
	return c.value("fence_create", &rpcReq{Op: opFenceCreate, U: [6]uint64{cx, initial}})
}

// FenceWait forwards one slice of a wait; a long wait is legitimate, so a slice that times out
// never kills the child (the call timeout is far longer than a slice).
func (c *isoCalls) FenceWait(f, value uint64, timeout time.Duration) error {
	_, err := c.pr.callTimed("fence_wait", &rpcReq{Op: opFenceWait, U: [6]uint64{f, value, uint64(timeout)}})
	return err
}

func (c *isoCalls) FenceValue(f uint64) (uint64, error) {
	return c.value("fence_value", &rpcReq{Op: opFenceValue, U: [6]uint64{f}})
}

func (c *isoCalls) FenceSignal(f, value uint64) error {
	_, err := c.pr.callTimed("fence_signal", &rpcReq{Op: opFenceSignal, U: [6]uint64{f, value}})
	return err
}

func (c *isoCalls) FenceRelease(f uint64) error {
	return c.release("fence_release", opFenceRelease, f)
}
