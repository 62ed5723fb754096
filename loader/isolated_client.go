package loader

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/core"
)

// Trust model: an isolated backend runs the plugin in a child process so that its crashes,
// hangs and leaks do not reach the host; it is not a sandbox. The child has the host's user,
// files and network. A plugin is code: load plugins only from paths you trust. WithHostChecksum
// pins the SHA-256 of the plugin-host executable (go-plugin's SecureConfig), so that a swapped
// host binary is refused before it runs.

// EnvHostBinary names the executable whose `plugin-host` subcommand serves isolated plugins
// (default: the running executable).
const EnvHostBinary = "XPU_PLUGIN_HOST"

// envChildPlugin tells a plugin host which plugin to open (also its argument).
const envChildPlugin = "XPU_PLUGIN_HOST_PLUGIN"

// defaultCallTimeout bounds calls that take no context (alloc, bind, release...): a plugin
// stuck in one past it is killed, so that the host never hangs.
const defaultCallTimeout = time.Minute

// WithHostBinary names the executable that serves isolated plugins and probes plugin files
// (its "plugin-host" subcommand, e.g. a built xpu). The default is XPU_PLUGIN_HOST, else the
// running executable, which then must call ServeIfPluginHost first thing in main.
func WithHostBinary(path string) Option { return func(c *config) { c.hostBinary = path } }

// WithHostChecksum refuses to start a plugin host whose executable's SHA-256 differs from sum.
func WithHostChecksum(sum []byte) Option {
	return func(c *config) { c.hostChecksum = append([]byte(nil), sum...) }
}

// WithCallTimeout bounds isolated calls that take no context (default one minute).
func WithCallTimeout(d time.Duration) Option { return func(c *config) { c.callTimeout = d } }

// MinExecuteTimeout is the least automatic deadline of an isolated execute.
const MinExecuteTimeout = 30 * time.Second

// execTimeoutFactor: the automatic deadline of an isolated execute is this many times the
// longest earlier run of the same executable (at least MinExecuteTimeout).
const execTimeoutFactor = 10

// WithExecuteTimeout sets the deadline of every isolated execute (Execution.Run) to d. A plugin
// still inside execution_run at the deadline is killed: the run fails with an error wrapping
// core.ErrTimeout and core.ErrBackendCrashed, and the backend can be restarted (Restarter).
// d <= 0 (the default) means automatic: 10× the longest earlier run of the same executable, at
// least MinExecuteTimeout. The caller's context can end a run sooner.
func WithExecuteTimeout(d time.Duration) Option { return func(c *config) { c.execTimeout = d } }

// execDeadline is the deadline of one run of an executable whose longest earlier run took
// longest: fixed when set, otherwise automatic (see WithExecuteTimeout).
func execDeadline(fixed, longest time.Duration) time.Duration {
	if fixed > 0 {
		return fixed
	}
	return max(MinExecuteTimeout, execTimeoutFactor*min(longest, math.MaxInt64/execTimeoutFactor))
}

// execTimeoutError is the cause of a run that passed its deadline. It is formatted only when
// it is shown: a run on the decode loop allocates just the struct.
type execTimeoutError struct {
	name, path     string
	limit, longest time.Duration
	fixed          bool
}

func (e *execTimeoutError) Error() string {
	how := fmt.Sprintf("%d× its longest earlier run (%v), at least %v", execTimeoutFactor,
		e.longest.Round(time.Microsecond), MinExecuteTimeout)
	if e.fixed {
		how = "the deadline set"
	}
	return fmt.Sprintf("isolated %s (%s): execution_run did not return within %v (%s; change it with "+
		"xpu's --timeout or loader.WithExecuteTimeout)", e.name, e.path, e.limit, how)
}

func (e *execTimeoutError) Unwrap() error { return core.ErrTimeout }

// IsolatedStats counts what crossed the rpc of an isolated backend.
type IsolatedStats struct {
	Calls         uint64 // calls made: rpcs and runs on the run ring
	RingCalls     uint64 // of them, calls on the shared-memory run ring (no rpc, no socket)
	BytesSent     uint64 // payload bytes of requests
	BytesReceived uint64 // payload bytes of answers
	Restarts      int
	PID           int // the current child process
}

// Stats returns the rpc counters of an isolated backend (ok false for any other backend).
func Stats(be core.Backend) (IsolatedStats, bool) {
	b, ok := be.(*isoBackend)
	if !ok {
		return IsolatedStats{}, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	pr := b.proc
	st := IsolatedStats{Restarts: b.restarts}
	if pr != nil {
		st.Calls = pr.counter.calls.Load()
		st.RingCalls = pr.counter.ringCalls.Load()
		st.BytesSent = pr.counter.sent.Load()
		st.BytesReceived = pr.counter.recv.Load()
		if pr.cmd.Process != nil {
			st.PID = pr.cmd.Process.Pid
		}
	}
	return st, true
}

// Restarter is implemented by isolated backends (core.Restarter).
type Restarter = core.Restarter

// isoProc is one child process serving one plugin.
type isoProc struct {
	name    string
	cmd     *exec.Cmd
	client  *plugin.Client
	cc      *grpc.ClientConn
	fds     *fdSender
	sock    int
	logs    *ringLog
	counter *byteCounter
	timeout time.Duration

	mu   sync.Mutex
	dead error // set once the process is gone: every later call fails fast with it

	fastMu sync.Mutex // one run on the ring at a time; overlapping runs take gRPC
	ring   *ring      // the run ring (ring.go); nil once released
	seq    uint32     // the last request on the ring (fastMu)
	ringMu sync.Mutex // kill's wake-up against release's unmapping

	gone      atomic.Bool   // the child closed its end of the fd socket: it is dead or dying
	watchDone chan struct{} // closed when watch returns
}

func (c *config) hostPath() (string, error) {
	if c.hostBinary != "" {
		return c.hostBinary, nil
	}
	if p := os.Getenv(EnvHostBinary); p != "" {
		return p, nil
	}
	return os.Executable()
}

func startProc(cfg *config, cd Candidate) (*isoProc, error) {
	bin, err := cfg.hostPath()
	if err != nil {
		return nil, fmt.Errorf("isolated %s: no plugin-host executable: %w", cd.Name, err)
	}
	pair, err := fdSocketPair()
	if err != nil {
		return nil, fmt.Errorf("isolated %s: socketpair: %v: %w", cd.Name, err, core.ErrInternal)
	}
	childEnd := os.NewFile(uintptr(pair[1]), "xpu-fd-socket")
	defer childEnd.Close() // the child has its own copy once started

	// the environment is explicit (SkipHostEnv below): see spawn.go
	cmd, err := hostCommand(bin, []string{"plugin-host", cd.Path}, envChildPlugin+"="+cd.Path,
		envHostMode+"="+hostModeServe)
	if err != nil {
		unix.Close(pair[0])
		return nil, fmt.Errorf("isolated %s: %w", cd.Name, err)
	}
	cmd.ExtraFiles = []*os.File{childEnd} // fd 3 in the child
	pr := &isoProc{name: cd.Name, cmd: cmd, sock: pair[0], fds: &fdSender{sock: pair[0]},
		logs: &ringLog{name: cd.Name, log: cfg.logger}, counter: &byteCounter{}, timeout: cfg.callTimeout}
	if pr.timeout <= 0 {
		pr.timeout = defaultCallTimeout
	}
	cc := &plugin.ClientConfig{
		HandshakeConfig:  handshake,
		Plugins:          plugin.PluginSet{pluginSetName: &grpcBackendPlugin{}},
		Cmd:              cmd,
		SkipHostEnv:      true,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
		Stderr:           pr.logs,
		StartTimeout:     30 * time.Second,
		GRPCDialOptions:  []grpc.DialOption{grpc.WithStatsHandler(pr.counter)},
	}
	if cfg.hostChecksum != nil {
		cc.SecureConfig = &plugin.SecureConfig{Checksum: cfg.hostChecksum, Hash: sha256.New()}
	}
	pr.client = plugin.NewClient(cc)
	rpc, err := pr.client.Client()
	if err == nil {
		var raw any
		if raw, err = rpc.Dispense(pluginSetName); err == nil {
			var ok bool
			if pr.cc, ok = raw.(*grpc.ClientConn); !ok {
				err = fmt.Errorf("dispensed %T", raw)
			}
		}
	}
	if err != nil {
		pr.client.Kill()
		killTree(cmd)
		unix.Close(pr.sock)
		if errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
			return nil, fmt.Errorf("isolated %s: %s: %v: %w", cd.Name, bin, err, core.ErrIncompatible)
		}
		if err := versionMismatch(cd.Name, bin, err); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("isolated %s: starting %s plugin-host: %v; its output:\n%s: %w", cd.Name,
			bin, err, pr.logs.last(), core.ErrBackendCrashed)
	}
	return pr, nil
}

// theirVersion finds the other side's protocol version in go-plugin's handshake complaint
// ("incompatible API version with plugin. Plugin version: 1, Client versions: [1002]").
var theirVersion = regexp.MustCompile(`incompatible API version with plugin\. Plugin version: (\d+)`)

// versionMismatch turns a handshake refused for its protocol version into an error that says
// what differs and what to do; nil for any other start failure.
func versionMismatch(name, bin string, err error) error {
	m := theirVersion.FindStringSubmatch(err.Error())
	if m == nil {
		return nil
	}
	v, _ := strconv.Atoi(m[1])
	major, rev := v/1000, v%1000
	if v < 1000 {
		major, rev = v, 1 // before wire revisions the version was the ABI major alone
	}
	return fmt.Errorf("isolated %s: the plugin host %s speaks isolation protocol %d (ABI major %d, wire revision %d), "+
		"this xpu speaks %d (ABI major %d, wire revision %d): use the same xpu build as plugin host "+
		"(%s, loader.WithHostBinary): %w", name, bin, v, major, rev, protocolVersion, abi.ABIMajor,
		wireRevision, EnvHostBinary, core.ErrIncompatible)
}

func (pr *isoProc) deadErr() error {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.dead
}

// kill ends the child (if still alive) and records why every later call fails.
func (pr *isoProc) kill(reason error) {
	pr.mu.Lock()
	if pr.dead == nil {
		pr.dead = reason
	}
	pr.mu.Unlock()
	killTree(pr.cmd) // the whole process group: a plugin may have started helpers
	pr.client.Kill()
	// shutdown, not close: a fast run may be blocked reading the socket right now; it wakes
	// up and fails. release closes the fd once nobody can be using it.
	pr.fds.mu.Lock()
	if pr.sock >= 0 {
		unix.Shutdown(pr.sock, unix.SHUT_RDWR)
	}
	pr.fds.mu.Unlock()
	pr.wakeHost()
}

// wakeHost wakes a run asleep on the ring, so that it sees at once that the child is dead.
func (pr *isoProc) wakeHost() {
	pr.ringMu.Lock()
	if pr.ring != nil {
		futexWake(pr.ring.respSeq)
	}
	pr.ringMu.Unlock()
}

// release closes the socket pair and unmaps the ring of a killed child.
func (pr *isoProc) release() {
	pr.fastMu.Lock()
	defer pr.fastMu.Unlock()
	pr.fds.mu.Lock()
	if pr.sock >= 0 {
		unix.Shutdown(pr.sock, unix.SHUT_RDWR) // ends watch's read
	}
	pr.fds.mu.Unlock()
	if pr.watchDone != nil {
		<-pr.watchDone
	}
	pr.fds.mu.Lock()
	if pr.sock >= 0 {
		unix.Close(pr.sock)
		pr.sock, pr.fds.sock = -1, -1
	}
	pr.fds.mu.Unlock()
	pr.ringMu.Lock()
	if pr.ring != nil {
		pr.ring.mem.close()
		pr.ring = nil
	}
	pr.ringMu.Unlock()
}

// attachRing makes the run ring and hands it to the child, and starts watching the fd socket.
func (pr *isoProc) attachRing(ctx context.Context) error {
	r, err := newRing()
	if err != nil {
		return fmt.Errorf("isolated %s: run ring: %w", pr.name, err)
	}
	id, err := pr.fds.send(r.mem.fd)
	if err != nil {
		r.mem.close()
		return pr.crashed(err)
	}
	unix.Close(r.mem.fd) // the child has its own; the mapping keeps the page here
	r.mem.fd = -1
	if _, err := pr.call(ctx, "ring_attach", &rpcReq{Op: opRingAttach, U: [6]uint64{id}}); err != nil {
		r.mem.close()
		return err
	}
	pr.ringMu.Lock()
	pr.ring = r
	pr.ringMu.Unlock()
	pr.watchDone = make(chan struct{})
	go pr.watch(pr.sock)
	return nil
}

// watch reads the host end of the fd socket, on which the child never writes: the read returns
// when the child's end closes (it died) or kill shuts the socket down. Either wakes a run
// asleep on the ring.
func (pr *isoProc) watch(sock int) {
	defer close(pr.watchDone)
	var b [64]byte
	for {
		n, err := unix.Read(sock, b[:])
		if err == unix.EINTR || (err == nil && n > 0) {
			continue
		}
		pr.gone.Store(true)
		pr.wakeHost()
		return
	}
}

// ringCall makes call q (ringable) on the run ring. ok is false when another call holds the
// ring (the caller then uses gRPC, so that overlapping calls stay concurrent). expired is true
// when deadline passed with the child still in the call: the caller kills it. The caller's
// context ending kills the child here.
func (pr *isoProc) ringCall(ctx context.Context, entry string, q *rpcReq, deadline time.Time) (vals [2]uint64, ok, expired bool, err error) {
	if !pr.fastMu.TryLock() {
		return vals, false, false, nil
	}
	defer pr.fastMu.Unlock()
	if err := pr.deadErr(); err != nil {
		return vals, true, false, err
	}
	r := pr.ring
	if r == nil {
		return vals, false, false, nil // not attached (cannot happen once started): gRPC still works
	}
	pr.seq++
	seq := pr.seq
	pr.counter.calls.Add(1)
	pr.counter.ringCalls.Add(1)
	r.post(seq, q)
	pr.counter.sent.Add(ringReqBytes)
	got := spinFor(r.respSeq, seq-1, hostSpin)
	for got != seq {
		switch {
		case got != seq-1:
			return vals, true, false, pr.crashed(fmt.Errorf("garbled run ring: answer %d to request %d", got, seq))
		case pr.deadErr() != nil:
			return vals, true, false, pr.deadErr()
		case pr.gone.Load() || pr.client.Exited():
			return vals, true, false, pr.crashed(fmt.Errorf("it ended during %s", entry))
		case ctx.Err() != nil:
			return vals, true, false, pr.timedOut(ctx, entry, ctx.Err())
		}
		now := time.Now()
		if !now.Before(deadline) {
			return vals, true, true, nil
		}
		slice := min(waitSlice, deadline.Sub(now))
		if d, ok := ctx.Deadline(); ok {
			slice = min(slice, max(d.Sub(now), time.Millisecond))
		}
		// say we sleep before the last look (the child's answer mirrors ring.next)
		atomic.StoreUint32(r.hostWaiting, 1)
		if got = atomic.LoadUint32(r.respSeq); got == seq-1 {
			futexWait(r.respSeq, seq-1, slice)
			got = atomic.LoadUint32(r.respSeq)
		}
		atomic.StoreUint32(r.hostWaiting, 0)
	}
	st, vals, msg := r.result()
	pr.counter.recv.Add(ringRespHdrBytes + uint64(len(msg)))
	if st := abi.Status(st); st != abi.StatusOK {
		return vals, true, false, fmt.Errorf("%s %s: %w", pr.name, entry, st.Err(msg))
	}
	return vals, true, false, nil
}

// noDeadline is the ring's deadline for calls bounded by their context alone.
var noDeadline = time.Unix(1<<62, 0)

// expired is why the child is killed when a call outlives ctx (whose error is cerr): the
// call's own deadline (a cause wrapping core.ErrTimeout) or the caller's context.
func (pr *isoProc) expired(ctx context.Context, entry string, cerr error) error {
	if cause := context.Cause(ctx); errors.Is(cause, core.ErrTimeout) {
		return fmt.Errorf("%w; the plugin process was killed: %w", cause, core.ErrBackendCrashed)
	}
	return fmt.Errorf("isolated %s: %s did not return before its context ended (%v); the plugin process was killed: %w",
		pr.name, entry, cerr, core.ErrBackendCrashed)
}

// timedOut kills the child of a call that outlived ctx (unless it is dead already: then that
// is the real cause) and returns the call's error, wrapping cerr and the reason.
func (pr *isoProc) timedOut(ctx context.Context, entry string, cerr error) error {
	if pr.deadErr() == nil {
		pr.kill(pr.expired(ctx, entry, cerr))
	}
	return fmt.Errorf("%s: %w; %w", entry, cerr, pr.deadErr())
}

// crashed turns a transport failure into ErrBackendCrashed with the child's last lines. It
// waits (bounded) for the process to be gone so that its dying words are in the log.
func (pr *isoProc) crashed(cause error) error {
	deadline := time.Now().Add(2 * time.Second)
	for !pr.client.Exited() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	pr.logs.settle(100*time.Millisecond, time.Second)
	state := "stopped answering"
	if pr.client.Exited() {
		state = "exited"
		if ps := pr.cmd.ProcessState; ps != nil {
			state = "exited (" + ps.String() + ")"
		}
	}
	err := fmt.Errorf("isolated %s: the plugin process %s (%v); its last output:\n%s\n%w", pr.name,
		state, cause, pr.logs.last(), core.ErrBackendCrashed)
	pr.kill(err)
	return pr.deadErr()
}

// callTimeoutError is the cause of a context-less call that passed the call timeout
// (formatted only when shown: binds are on the decode loop).
type callTimeoutError struct {
	name, entry string
	limit       time.Duration
}

func (e *callTimeoutError) Error() string {
	return fmt.Sprintf("isolated %s: %s did not return within the call timeout of %v (loader.WithCallTimeout)",
		e.name, e.entry, e.limit)
}

func (e *callTimeoutError) Unwrap() error { return core.ErrTimeout }

// overdue kills the child of a call that passed its own deadline (cause says which) and
// returns the call's error; a child that died first keeps its own reason.
func (pr *isoProc) overdue(cause error) error {
	if pr.deadErr() == nil {
		pr.kill(fmt.Errorf("%w; the plugin process was killed: %w", cause, core.ErrBackendCrashed))
	}
	return pr.deadErr()
}

// callTimed is call for the entries that take no context: the call timeout applies.
func (pr *isoProc) callTimed(entry string, req *rpcReq) (*rpcResp, error) {
	if err := pr.deadErr(); err != nil {
		return nil, err
	}
	if ringable(req) {
		vals, ok, expired, err := pr.ringCall(context.Background(), entry, req, time.Now().Add(pr.timeout))
		if expired {
			return nil, pr.overdue(&callTimeoutError{name: pr.name, entry: entry, limit: pr.timeout})
		}
		if ok {
			return &rpcResp{U: vals}, err
		}
	}
	ctx, cancel := context.WithTimeoutCause(context.Background(), pr.timeout,
		&callTimeoutError{name: pr.name, entry: entry, limit: pr.timeout})
	defer cancel()
	return pr.rpc(ctx, entry, req)
}

// call makes one call: on the run ring when it can go there and the ring is free, otherwise
// over gRPC. A call that outlives its context kills the child: the plugin cannot be
// interrupted otherwise.
func (pr *isoProc) call(ctx context.Context, entry string, req *rpcReq) (*rpcResp, error) {
	if err := pr.deadErr(); err != nil {
		return nil, err
	}
	if ringable(req) {
		vals, ok, _, err := pr.ringCall(ctx, entry, req, noDeadline)
		if ok {
			return &rpcResp{U: vals}, err
		}
	}
	return pr.rpc(ctx, entry, req)
}

// rpc sends one call over gRPC.
func (pr *isoProc) rpc(ctx context.Context, entry string, req *rpcReq) (*rpcResp, error) {
	if err := pr.deadErr(); err != nil {
		return nil, err
	}
	resp := new(rpcResp)
	err := pr.cc.Invoke(ctx, callMethod, req, resp, grpc.CallContentSubtype(codecName))
	if err == nil {
		if st := abi.Status(resp.Status); st != abi.StatusOK {
			return resp, fmt.Errorf("%s %s: %w", pr.name, entry, st.Err(resp.S))
		}
		return resp, nil
	}
	cerr := ctx.Err()
	if cerr == nil && status.Code(err) == codes.DeadlineExceeded {
		// the server side noticed the deadline first; ours is due now (its cause says why)
		select {
		case <-ctx.Done():
			cerr = ctx.Err()
		case <-time.After(100 * time.Millisecond):
			cerr = context.DeadlineExceeded
		}
	}
	if cerr != nil {
		return nil, pr.timedOut(ctx, entry, cerr)
	}
	return nil, pr.crashed(err)
}

func (pr *isoProc) close() error {
	if pr.deadErr() != nil {
		pr.release()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := pr.call(ctx, "shutdown", &rpcReq{Op: opShutdown})
	pr.kill(fmt.Errorf("isolated %s: backend closed: %w", pr.name, core.ErrBadState))
	pr.release()
	if err != nil && !errors.Is(err, core.ErrBackendCrashed) {
		return err
	}
	return nil
}
