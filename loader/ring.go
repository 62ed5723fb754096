package loader

import (
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/xpuhub/xpu/core"
)

// The run ring carries the hot calls of an isolated backend past gRPC and past the socket:
// execution_run, and every other call whose request is integers only and whose answer has no
// blob (execution_bind, which a decode loop makes per step, buffer and fence calls: ringable).
// One page of a memfd mapped by both processes holds a request slot and an answer slot, each
// with a sequence number that is also a futex word. The host writes the operation and its
// arguments and bumps reqSeq; the child, spinning briefly or asleep on reqSeq, serves it,
// writes the status, values and last_error text and sets respSeq to the same number; the
// host, spinning briefly or asleep on respSeq, reads the answer. A futex_wake is made only
// when the other side has said (childWaiting, hostWaiting) that it is asleep, so a call
// between two spinning processes would cost no system call at all, and one between sleeping
// processes costs two futex wakes and two waits (against a socket write and read on each side
// and a goroutine hand-off in the child for the socket path it replaced, and an HTTP/2 round
// trip for gRPC). Only one call is on the ring at a time (isoProc.fastMu); calls that overlap
// it go through gRPC.
//
// A child that dies while the host sleeps is noticed at once through the fd socket (EOF wakes
// the host: isoProc.watch) and at the latest one waitSlice later (the host's futex waits are
// bounded, and between them it checks the process, its context and the deadline).

// Ring layout: byte offsets in the mapping. Sequence words of the two sides are on different
// cache lines so that one side's spinning does not slow the other's writes.
const (
	ringSize         = 16 << 10
	ringMagic        = 0x474e5258 // "XRNG"
	offMagic         = 0          // u32 ringMagic, then u32 wireRevision
	offReqSeq        = 64         // u32 futex word, written by the host
	offChildWaiting  = 68         // u32: the child sleeps (or is about to) on reqSeq
	offReqOp         = 72         // u32 operation (isolated_proto.go)
	offReqArgs       = 80         // 6 × u64: rpcReq.U
	offRespSeq       = 192        // u32 futex word, written by the child
	offHostWaiting   = 196        // u32: the host sleeps (or is about to) on respSeq
	offRespStatus    = 200        // i32 xpu_status
	offRespMsgLen    = 204        // u32 bytes of last_error text at offRespMsg
	offRespVals      = 208        // 2 × u64: rpcResp.U
	offRespMsg       = 256        // last_error text, truncated to the mapping
	ringReqBytes     = 8 + 6*8    // what a request writes (for Stats): seq, op, arguments
	ringRespHdrBytes = 12 + 2*8   // what an answer writes besides its text: seq, status, length, values
)

// ringable tells whether a call can go on the run ring: its request is integers only and its
// answer has no blob. The child checks the same before serving one.
func ringable(q *rpcReq) bool {
	if q.S != "" || len(q.B) != 0 || len(q.C) != 0 || len(q.F) != 0 {
		return false
	}
	switch q.Op {
	case opInfo, opAnalyze, opSerialize, opPrepare, opShutdown, opRingAttach:
		return false
	}
	return true
}

// Spin budgets before a futex sleep (0: sleep at once). Spinning pays only when the other
// process already runs on another core; on a 2-core machine with other work on it, budgets of a
// few µs made an execute slower and costlier (the lab notes on isolated backends
// have the measurements), and on a decode loop the next request never comes within a few µs
// anyway. Kept as knobs for machines with idle cores.
var (
	hostSpin  time.Duration
	childSpin time.Duration
)

// waitSlice bounds each futex sleep of the host: between two, it checks the child, its context
// and the deadline.
const waitSlice = 20 * time.Millisecond

// ring is one side's view of the shared page.
type ring struct {
	mem                                  *shm
	reqSeq, childWaiting, op             *uint32
	respSeq, hostWaiting, status, msgLen *uint32
	args                                 [6]*uint64
	vals                                 [2]*uint64
	msg                                  []byte
}

func (r *ring) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem.view[off])) }

// newRing makes the shared page (host side).
func newRing() (*ring, error) {
	mem, err := newShm(ringSize)
	if err != nil {
		return nil, err
	}
	r := ringOver(mem)
	atomic.StoreUint32(r.u32(offMagic), ringMagic)
	atomic.StoreUint32(r.u32(offMagic+4), wireRevision)
	return r, nil
}

// attachRing maps the host's page (child side) and checks that it is one.
func attachRing(fd int) (*ring, error) {
	mem, err := mapShm(fd, ringSize)
	if err != nil {
		return nil, err
	}
	r := ringOver(mem)
	if m, v := atomic.LoadUint32(r.u32(offMagic)), atomic.LoadUint32(r.u32(offMagic+4)); m != ringMagic || v != wireRevision {
		mem.close()
		return nil, fmt.Errorf("run ring: magic %#x revision %d, want %#x revision %d: %w", m, v, ringMagic,
			wireRevision, core.ErrIncompatible)
	}
	return r, nil
}

func ringOver(mem *shm) *ring {
	r := &ring{mem: mem, msg: mem.view[offRespMsg:]}
	r.reqSeq, r.childWaiting, r.op = r.u32(offReqSeq), r.u32(offChildWaiting), r.u32(offReqOp)
	for i := range r.args {
		r.args[i] = (*uint64)(unsafe.Pointer(&mem.view[offReqArgs+8*i]))
	}
	r.respSeq, r.hostWaiting = r.u32(offRespSeq), r.u32(offHostWaiting)
	r.status, r.msgLen = r.u32(offRespStatus), r.u32(offRespMsgLen)
	for i := range r.vals {
		r.vals[i] = (*uint64)(unsafe.Pointer(&mem.view[offRespVals+8*i]))
	}
	return r
}

// spinFor waits until *addr != old for at most budget, without a system call; it returns the
// value seen last.
func spinFor(addr *uint32, old uint32, budget time.Duration) uint32 {
	v := atomic.LoadUint32(addr)
	if v != old || budget <= 0 {
		return v
	}
	start := time.Now()
	for i := 1; ; i++ {
		if v = atomic.LoadUint32(addr); v != old {
			return v
		}
		// reading the clock costs more than a load: look at it every few rounds only
		if i%32 == 0 && time.Since(start) >= budget {
			return v
		}
	}
}

// next is the child's wait for the request after last: a short spin, then sleeps on reqSeq.
func (r *ring) next(last uint32) uint32 {
	if v := spinFor(r.reqSeq, last, childSpin); v != last {
		return v
	}
	for {
		// say we sleep before the last look: the host bumps reqSeq and then reads childWaiting,
		// so either it sees the flag and wakes us or we see its request (both sequentially
		// consistent atomics)
		atomic.StoreUint32(r.childWaiting, 1)
		if v := atomic.LoadUint32(r.reqSeq); v != last {
			atomic.StoreUint32(r.childWaiting, 0)
			return v
		}
		futexWait(r.reqSeq, last, -1)
		atomic.StoreUint32(r.childWaiting, 0)
		if v := atomic.LoadUint32(r.reqSeq); v != last {
			return v
		}
	}
}

// request reads the request the child was woken for.
func (r *ring) request() *rpcReq {
	q := &rpcReq{Op: atomic.LoadUint32(r.op)}
	for i, a := range r.args {
		q.U[i] = atomic.LoadUint64(a)
	}
	return q
}

// answer publishes the child's answer to request seq and wakes the host if it sleeps.
func (r *ring) answer(seq uint32, resp *rpcResp) {
	n := copy(r.msg, resp.S)
	atomic.StoreUint32(r.status, uint32(resp.Status))
	atomic.StoreUint32(r.msgLen, uint32(n))
	for i, v := range r.vals {
		atomic.StoreUint64(v, resp.U[i])
	}
	atomic.StoreUint32(r.respSeq, seq)
	if atomic.LoadUint32(r.hostWaiting) != 0 {
		futexWake(r.respSeq)
	}
}

// post is the host's request q as number seq; it wakes the child if it sleeps.
func (r *ring) post(seq uint32, q *rpcReq) {
	atomic.StoreUint32(r.op, q.Op)
	for i, a := range r.args {
		atomic.StoreUint64(a, q.U[i])
	}
	atomic.StoreUint32(r.reqSeq, seq)
	if atomic.LoadUint32(r.childWaiting) != 0 {
		futexWake(r.reqSeq)
	}
}

// result reads the answer (after respSeq showed it).
func (r *ring) result() (status int32, vals [2]uint64, msg string) {
	n := min(int(atomic.LoadUint32(r.msgLen)), len(r.msg))
	for i, v := range r.vals {
		vals[i] = atomic.LoadUint64(v)
	}
	return int32(atomic.LoadUint32(r.status)), vals, string(r.msg[:n])
}
