package loader

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
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

// WithHostBinary names the executable that serves isolated plugins (its "plugin-host"
// subcommand). The default is XPU_PLUGIN_HOST, else the running executable.
func WithHostBinary(path string) Option { return func(c *config) { c.hostBinary = path } }

// WithHostChecksum refuses to start a plugin host whose executable's SHA-256 differs from sum.
func WithHostChecksum(sum []byte) Option {
	return func(c *config) { c.hostChecksum = append([]byte(nil), sum...) }
}

// WithCallTimeout bounds isolated calls that take no context (default one minute).
func WithCallTimeout(d time.Duration) Option { return func(c *config) { c.callTimeout = d } }

// IsolatedStats counts what crossed the rpc of an isolated backend.
type IsolatedStats struct {
	Calls         uint64 // rpcs sent
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
		st.BytesSent = pr.counter.sent.Load()
		st.BytesReceived = pr.counter.recv.Load()
		if pr.cmd.Process != nil {
			st.PID = pr.cmd.Process.Pid
		}
	}
	return st, true
}

// Restarter is implemented by isolated backends: Restart starts a fresh child process after a
// crash (or at any time). Everything made from the old process stays invalid and answers
// core.ErrBackendCrashed; devices and new contexts work again.
type Restarter interface {
	Restart(ctx context.Context) error
}

// byteCounter is a grpc stats handler counting request and answer payload bytes.
type byteCounter struct {
	calls, sent, recv atomic.Uint64
}

func (c *byteCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (c *byteCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (c *byteCounter) HandleConn(context.Context, stats.ConnStats) {}
func (c *byteCounter) HandleRPC(_ context.Context, s stats.RPCStats) {
	switch p := s.(type) {
	case *stats.Begin:
		c.calls.Add(1)
	case *stats.OutPayload:
		c.sent.Add(uint64(p.WireLength))
	case *stats.InPayload:
		c.recv.Add(uint64(p.WireLength))
	}
}

// ringLog keeps the child's last stderr lines for crash reports, and forwards each line to
// slog at debug level.
type ringLog struct {
	mu      sync.Mutex
	lines   []string
	partial []byte
	name    string
	written time.Time
	log     *slog.Logger // nil: slog.Default()
}

// settle waits (bounded) until no output arrived for a moment: a dying child's last words are
// still in the pipe when its exit is noticed.
func (r *ringLog) settle(quiet, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		idle := time.Since(r.written)
		r.mu.Unlock()
		if idle >= quiet {
			return
		}
		time.Sleep(quiet / 4)
	}
}

// reportLines is how many meaningful lines a crash report quotes.
const reportLines = 12

func (r *ringLog) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.written = time.Now()
	r.partial = append(r.partial, b...)
	for {
		i := bytes.IndexByte(r.partial, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimRight(string(r.partial[:i]), "\r")
		r.partial = r.partial[i+1:]
		if line == "" {
			continue
		}
		logOrDefault(r.log).Debug("plugin-host", "plugin", r.name, "line", line)
		// a Go crash dump runs to thousands of lines: keep only those that can say why
		if crashNoise.MatchString(line) {
			continue
		}
		r.lines = append(r.lines, line)
		if len(r.lines) > reportLines {
			r.lines = r.lines[len(r.lines)-reportLines:]
		}
	}
	return len(b), nil
}

// crashNoise matches the parts of a Go crash dump that say nothing about the cause: register
// values, goroutine headers and stack frames.
var crashNoise = regexp.MustCompile(`^(\t|[a-z0-9]{2,6}\s+0x[0-9a-f]+$|goroutine \d+|created by |[\w./*()\[\]-]+\(.*\)$|\.\.\.)`)

// last is the child's last meaningful lines: the signal or fatal error and the log lines
// before it, without the stack dump.
func (r *ringLog) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := r.lines
	if len(r.partial) > 0 && !crashNoise.Match(r.partial) {
		keep = append(keep[:len(keep):len(keep)], string(r.partial))
	}
	if len(keep) == 0 {
		return "(no output)"
	}
	return strings.Join(keep, "\n")
}

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

	fastMu  sync.Mutex // one fast run at a time; overlapping runs take gRPC
	fastSeq uint64
	fastBuf []byte
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
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("isolated %s: socketpair: %v: %w", cd.Name, err, core.ErrInternal)
	}
	childEnd := os.NewFile(uintptr(pair[1]), "xpu-fd-socket")
	defer childEnd.Close() // the child has its own copy once started

	cmd := exec.Command(bin, "plugin-host", cd.Path)
	cmd.Env = []string{envChildPlugin + "=" + cd.Path}
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
		unix.Close(pr.sock)
		if errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
			return nil, fmt.Errorf("isolated %s: %s: %v: %w", cd.Name, bin, err, core.ErrIncompatible)
		}
		return nil, fmt.Errorf("isolated %s: starting %s plugin-host: %v; its output:\n%s: %w", cd.Name,
			bin, err, pr.logs.last(), core.ErrBackendCrashed)
	}
	return pr, nil
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
	if pr.cmd.Process != nil {
		pr.cmd.Process.Kill()
	}
	pr.client.Kill()
	// shutdown, not close: a fast run may be blocked reading the socket right now; it wakes
	// up and fails. release closes the fd once nobody can be using it.
	pr.fds.mu.Lock()
	if pr.sock >= 0 {
		unix.Shutdown(pr.sock, unix.SHUT_RDWR)
	}
	pr.fds.mu.Unlock()
}

// release closes the socket pair of a killed child.
func (pr *isoProc) release() {
	pr.fastMu.Lock()
	defer pr.fastMu.Unlock()
	pr.fds.mu.Lock()
	defer pr.fds.mu.Unlock()
	if pr.sock >= 0 {
		unix.Close(pr.sock)
		pr.sock, pr.fds.sock = -1, -1
	}
}

// tryFastRun runs execution ex over the socket pair. ok is false when another fast run is in
// flight (the caller then uses gRPC, so that overlapping runs stay concurrent).
func (pr *isoProc) tryFastRun(ctx context.Context, ex uint64) (ok bool, err error) {
	if !pr.fastMu.TryLock() {
		return false, nil
	}
	defer pr.fastMu.Unlock()
	if err := pr.deadErr(); err != nil {
		return true, err
	}
	if pr.fastBuf == nil {
		pr.fastBuf = make([]byte, 8192)
	}
	pr.fastSeq++
	seq := pr.fastSeq
	req := pr.fastBuf[:fastReqSize]
	binary.LittleEndian.PutUint32(req, fastRunMagic)
	binary.LittleEndian.PutUint32(req[4:], 0)
	binary.LittleEndian.PutUint64(req[8:], seq)
	binary.LittleEndian.PutUint64(req[16:], ex)
	// the plugin cannot be interrupted: a run that outlives ctx kills the child
	stop := context.AfterFunc(ctx, func() {
		pr.kill(fmt.Errorf("isolated %s: execution_run did not return before its context ended (%v); the plugin process was killed: %w",
			pr.name, ctx.Err(), core.ErrBackendCrashed))
	})
	defer stop()
	pr.counter.calls.Add(1)
	if _, err := writeRetry(pr.sock, req); err != nil {
		return true, pr.fastFailed(ctx, err)
	}
	pr.counter.sent.Add(fastReqSize)
	n, err := readRetry(pr.sock, pr.fastBuf)
	if err != nil || n < fastResHdr {
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return true, pr.fastFailed(ctx, err)
	}
	pr.counter.recv.Add(uint64(n))
	res := pr.fastBuf[:n]
	if binary.LittleEndian.Uint32(res) != fastResMagic || binary.LittleEndian.Uint64(res[8:]) != seq {
		return true, pr.crashed(fmt.Errorf("garbled answer on the fd socket"))
	}
	if st := abi.Status(int32(binary.LittleEndian.Uint32(res[4:]))); st != abi.StatusOK {
		return true, fmt.Errorf("%s execution_run: %w", pr.name, st.Err(string(res[fastResHdr:])))
	}
	return true, nil
}

func (pr *isoProc) fastFailed(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("execution_run: %w; %w", cerr, pr.deadErr())
	}
	return pr.crashed(err)
}

func writeRetry(fd int, b []byte) (int, error) {
	for {
		n, err := unix.Write(fd, b)
		if err != unix.EINTR {
			return n, err
		}
	}
}

func readRetry(fd int, b []byte) (int, error) {
	for {
		n, err := unix.Read(fd, b)
		if err != unix.EINTR {
			return n, err
		}
	}
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

// callTimed is call for the entries that take no context: the default call timeout applies.
func (pr *isoProc) callTimed(entry string, req *rpcReq) (*rpcResp, error) {
	ctx, cancel := context.WithTimeout(context.Background(), pr.timeout)
	defer cancel()
	return pr.call(ctx, entry, req)
}

// call sends one rpc. A call that outlives its context kills the child: the plugin cannot be
// interrupted otherwise.
func (pr *isoProc) call(ctx context.Context, entry string, req *rpcReq) (*rpcResp, error) {
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
		cerr = context.DeadlineExceeded // the server side noticed the deadline first
	}
	if cerr != nil {
		if dead := pr.deadErr(); dead != nil {
			return nil, dead
		}
		reason := fmt.Errorf("isolated %s: %s did not return before its context ended (%v); the plugin process was killed: %w",
			pr.name, entry, cerr, core.ErrBackendCrashed)
		pr.kill(reason)
		return nil, fmt.Errorf("%s: %w; %w", entry, cerr, reason)
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

// openIsolated starts a plugin host for cd and presents it as a core.Backend.
func openIsolated(ctx context.Context, cfg *config, cd Candidate) (core.Backend, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b := &isoBackend{cfg: cfg, cd: cd}
	if err := b.start(ctx); err != nil {
		return nil, err
	}
	return b, nil
}

type isoBackend struct {
	cfg *config
	cd  Candidate

	mu       sync.Mutex
	proc     *isoProc
	info     core.BackendInfo
	devs     []core.Device
	restarts int
	closed   bool
}

func (b *isoBackend) start(ctx context.Context) error {
	pr, err := startProc(b.cfg, b.cd)
	if err != nil {
		return err
	}
	resp, err := pr.call(ctx, "get_info", &rpcReq{Op: opInfo})
	if err != nil {
		pr.kill(err)
		return err
	}
	var info isoInfo
	if err := json.Unmarshal(resp.B, &info); err != nil {
		pr.kill(err)
		return fmt.Errorf("isolated %s: bad info from the plugin host: %v: %w", b.cd.Name, err, core.ErrInternal)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.proc = pr
	b.info = core.BackendInfo{Name: info.Probe.Name, Vendor: info.Info.Vendor,
		Version: info.Info.Version, BuildID: info.Info.BuildID, SDKVersion: info.Info.SDKVersion,
		Path: b.cd.Path, Score: info.Probe.Score, Isolated: true}
	b.devs = b.devs[:0]
	for i, d := range info.Devices {
		// host memory of this process cannot be shared with the child; fds and mapped
		// (shared) buffers can
		d.Caps = d.Caps&^core.CapImportHost | core.CapImportFD | core.CapHostVisible
		b.devs = append(b.devs, &isoDevice{b: b, idx: uint32(i), info: d})
	}
	return nil
}

func (b *isoBackend) current() (*isoProc, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("isolated %s: backend is closed: %w", b.cd.Name, core.ErrBadState)
	}
	return b.proc, nil
}

func (b *isoBackend) Info() core.BackendInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.info
}

func (b *isoBackend) Devices() []core.Device {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]core.Device(nil), b.devs...)
}

func (b *isoBackend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	pr := b.proc
	b.mu.Unlock()
	return pr.close()
}

// Restart kills the current child (if alive) and starts a new one.
func (b *isoBackend) Restart(ctx context.Context) error {
	pr, err := b.current()
	if err != nil {
		return err
	}
	pr.kill(fmt.Errorf("isolated %s: the backend was restarted: %w", b.cd.Name, core.ErrBackendCrashed))
	pr.release()
	if err := b.start(ctx); err != nil {
		return err
	}
	b.mu.Lock()
	b.restarts++
	b.mu.Unlock()
	return nil
}

type isoDevice struct {
	b    *isoBackend
	idx  uint32
	info core.DeviceInfo
}

func (d *isoDevice) Info() core.DeviceInfo { return d.info }

func (d *isoDevice) OpSupport(q core.OpQuery) core.Verdict {
	pr, err := d.b.current()
	if err != nil {
		return core.VerdictNo
	}
	resp, err := pr.callTimed("op_support", &rpcReq{Op: opOpSupport, U: [6]uint64{uint64(d.idx),
		uint64(q.Op), uint64(q.DTypeIn), uint64(q.DTypeWeight), uint64(q.DTypeOut), uint64(q.Rank)}})
	if err != nil || core.Verdict(resp.U[0]) > core.VerdictMaybe {
		return core.VerdictNo
	}
	return core.Verdict(resp.U[0])
}

func (d *isoDevice) NewContext(ctx context.Context, options map[string]string) (core.Context, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	opts, err := encodeOptions(options)
	if err != nil {
		return nil, fmt.Errorf("%s: new context: %w", d.info.ID(), err)
	}
	pr, err := d.b.current()
	if err != nil {
		return nil, err
	}
	resp, err := pr.call(ctx, "context_create", &rpcReq{Op: opContextCreate, U: [6]uint64{uint64(d.idx)}, S: opts})
	if err != nil {
		return nil, err
	}
	return &isoContext{d: d, pr: pr, h: resp.U[0], consts: map[constKey]*isoBuffer{}}, nil
}

// encodeOptions writes options as "k=v;k=v" in key order (as abi does for in-process plugins).
func encodeOptions(opts map[string]string) (string, error) {
	keys := make([]string, 0, len(opts))
	for k, v := range opts {
		if k == "" || strings.ContainsAny(k, "=;\x00") || strings.ContainsAny(v, ";\x00") {
			return "", fmt.Errorf("option %q=%q: keys need no '=' or ';', values no ';': %w", k, v,
				core.ErrInvalidArgument)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + opts[k]
	}
	return strings.Join(parts, ";"), nil
}

// constKey identifies a constant's bytes by their backing array (one upload per context).
type constKey struct {
	ptr *byte
	n   int
}

func keyOf(data []byte) constKey {
	if len(data) == 0 {
		return constKey{}
	}
	return constKey{ptr: &data[0], n: len(data)}
}

type isoContext struct {
	d  *isoDevice
	pr *isoProc
	h  uint64

	mu     sync.Mutex
	consts map[constKey]*isoBuffer
	live   int
	closed bool
}

func (c *isoContext) Device() core.Device { return c.d }

func (c *isoContext) adjust(n int) {
	c.mu.Lock()
	c.live += n
	c.mu.Unlock()
}

func (c *isoContext) check() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("%s: context is closed: %w", c.d.info.ID(), core.ErrBadState)
	}
	return c.pr.deadErr()
}

// newBuffer passes mem's fd to the child, which makes the plugin buffer over the same pages.
func (c *isoContext) newBuffer(mem *shm, op uint32, u1, u2 uint64) (*isoBuffer, error) {
	id, err := c.pr.fds.send(mem.fd)
	if err != nil {
		mem.close()
		return nil, c.pr.crashed(err)
	}
	// the child has its own fd now; the mapping keeps the pages for this side
	unix.Close(mem.fd)
	mem.fd = -1
	resp, err := c.pr.callTimed("buffer_alloc", &rpcReq{Op: op, U: [6]uint64{c.h, u1, u2, id}})
	if err != nil {
		mem.close()
		return nil, err
	}
	return &isoBuffer{c: c, h: resp.U[0], mem: mem}, nil
}

func (c *isoContext) Alloc(size int64, kind core.BufferKind) (core.Buffer, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("%s: alloc %d bytes: %w", c.d.info.ID(), size, core.ErrInvalidArgument)
	}
	mem, err := newShm(size)
	if err != nil {
		return nil, fmt.Errorf("%s: alloc: %w", c.d.info.ID(), err)
	}
	b, err := c.newBuffer(mem, opBufferAlloc, uint64(size), uint64(kind))
	if err != nil {
		return nil, err
	}
	c.adjust(1)
	return b, nil
}

func (c *isoContext) Import([]byte) (core.Buffer, error) {
	return nil, fmt.Errorf("%s: host memory cannot be shared with an isolated backend (use Alloc or ImportFD): %w",
		c.d.info.ID(), core.ErrUnsupported)
}

func (c *isoContext) ImportFD(fd int, offset, size int64) (core.Buffer, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if fd < 0 || offset < 0 || size <= 0 {
		return nil, fmt.Errorf("%s: import fd %d [%d,+%d): %w", c.d.info.ID(), fd, offset, size,
			core.ErrInvalidArgument)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: dup fd %d: %v: %w", c.d.info.ID(), fd, err, core.ErrInvalidArgument)
	}
	mem, err := mapShmRange(dup, offset, size)
	if err != nil {
		unix.Close(dup)
		return nil, fmt.Errorf("%s: import fd: %w", c.d.info.ID(), err)
	}
	b, err := c.newBuffer(mem, opBufferImportFD, uint64(offset), uint64(size))
	if err != nil {
		return nil, err
	}
	c.adjust(1)
	return b, nil
}

// constRef uploads a constant once per context: one host-side copy into shared memory, no
// bytes over the rpc (c.mu held).
func (c *isoContext) constRef(t *core.Tensor) (abi.ConstRef, error) {
	if int64(len(t.Data)) != t.Bytes() {
		return abi.ConstRef{}, fmt.Errorf("has %d bytes, its shape needs %d: %w", len(t.Data), t.Bytes(),
			core.ErrInvalidArgument)
	}
	key := keyOf(t.Data)
	if b, ok := c.consts[key]; ok {
		return abi.ConstRef{Buffer: b.h}, nil
	}
	mem, err := newShm(int64(max(len(t.Data), 1)))
	if err != nil {
		return abi.ConstRef{}, err
	}
	copy(mem.view, t.Data)
	b, err := c.newBuffer(mem, opBufferAlloc, uint64(len(mem.view)), uint64(core.BufferDevice))
	if err != nil {
		return abi.ConstRef{}, err
	}
	b.keep = t.Data
	c.consts[key] = b
	return abi.ConstRef{Buffer: b.h}, nil
}

func (c *isoContext) encode(g *core.Graph) ([]byte, error) {
	if g == nil {
		return nil, fmt.Errorf("nil graph: %w", core.ErrInvalidArgument)
	}
	if err := g.Validate(); err != nil {
		return nil, err
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return abi.EncodeGraph(g, c.constRef)
}

func (c *isoContext) analyze(ctx context.Context, g *core.Graph, ir []byte) ([]core.NodeVerdict, error) {
	resp, err := c.pr.call(ctx, "graph_analyze", &rpcReq{Op: opAnalyze, U: [6]uint64{c.h, uint64(len(g.Nodes))}, B: ir})
	if err != nil {
		return nil, err
	}
	var raw []abi.RawVerdict
	if err := json.Unmarshal(resp.B, &raw); err != nil || len(raw) != len(g.Nodes) {
		return nil, fmt.Errorf("%s: graph_analyze: bad answer (%v): %w", c.d.info.ID(), err, core.ErrInternal)
	}
	vs := make([]core.NodeVerdict, len(raw))
	for i, v := range raw {
		vs[i] = core.NodeVerdict{Supported: v.Verdict == core.VerdictYes, Precision: v.Precision, Reason: v.Reason}
		if !vs[i].Supported && vs[i].Reason == "" {
			vs[i].Reason = "refused without a reason"
		}
	}
	return vs, nil
}

func (c *isoContext) Analyze(ctx context.Context, g *core.Graph) ([]core.NodeVerdict, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ir, err := c.encode(g)
	if err != nil {
		return nil, fmt.Errorf("%s: analyze: %w", c.d.info.ID(), err)
	}
	return c.analyze(ctx, g, ir)
}

func (c *isoContext) Prepare(ctx context.Context, g *core.Graph, opts ...core.PrepareOption) (core.Executable, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	id := c.d.info.ID()
	cfg := core.NewPrepareConfig(opts...)
	popts, err := encodeOptions(cfg.Options)
	if err != nil {
		return nil, fmt.Errorf("%s: prepare: %w", id, err)
	}
	ir, err := c.encode(g)
	if err != nil {
		return nil, fmt.Errorf("%s: prepare: %w", id, err)
	}
	verdicts, err := c.analyze(ctx, g, ir)
	if err != nil && !errors.Is(err, core.ErrUnsupported) {
		return nil, fmt.Errorf("%s: prepare: %w", id, err)
	}
	var refused []string
	for i, v := range verdicts {
		if !v.Supported {
			refused = append(refused, fmt.Sprintf("%s: %s", g.Nodes[i], v.Reason))
		}
	}
	if len(refused) > 0 {
		return nil, fmt.Errorf("%s: prepare: %s: %w", id, strings.Join(refused, "; "), core.ErrUnsupported)
	}
	resp, err := c.pr.call(ctx, "graph_prepare", &rpcReq{Op: opPrepare, U: [6]uint64{c.h}, B: ir, S: popts, C: cfg.Cache})
	if err != nil {
		if se := (*abi.StatusError)(nil); errors.As(err, &se) {
			se.Msg = abi.NameNodes(g, se.Msg)
		}
		return nil, fmt.Errorf("%s: prepare: %w", id, err)
	}
	c.adjust(1)
	return &isoExecutable{c: c, h: resp.U[0], g: g, verdicts: verdicts}, nil
}

func (c *isoContext) NewFence(initial uint64) (core.Fence, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	resp, err := c.pr.callTimed("fence_create", &rpcReq{Op: opFenceCreate, U: [6]uint64{c.h, initial}})
	if err != nil {
		return nil, err
	}
	c.adjust(1)
	return &isoFence{c: c, h: resp.U[0]}, nil
}

func (c *isoContext) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	if c.live > 0 {
		return fmt.Errorf("%s: close context: %d buffers, executables or fences are still open: %w",
			c.d.info.ID(), c.live, core.ErrBadState)
	}
	if c.pr.deadErr() == nil {
		for k, b := range c.consts {
			if _, err := c.pr.callTimed("buffer_release", &rpcReq{Op: opBufferRelease, U: [6]uint64{b.h}}); err != nil {
				return err
			}
			b.mem.close()
			delete(c.consts, k)
		}
		if _, err := c.pr.callTimed("context_release", &rpcReq{Op: opContextRelease, U: [6]uint64{c.h}}); err != nil {
			return err
		}
	}
	for _, b := range c.consts {
		b.mem.close()
	}
	c.closed = true
	return nil
}

type isoBuffer struct {
	c    *isoContext
	h    uint64
	mem  *shm
	keep []byte

	mu     sync.Mutex
	closed bool
}

func (b *isoBuffer) Size() int64 { return int64(len(b.mem.view)) }

func (b *isoBuffer) bytes(what string, offset int64, n int) ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("%s: buffer is closed: %w", what, core.ErrBadState)
	}
	size := int64(len(b.mem.view))
	if offset < 0 || offset > size || int64(n) > size-offset {
		return nil, fmt.Errorf("%s [%d,+%d) outside a %d-byte buffer: %w", what, offset, n, size,
			core.ErrInvalidArgument)
	}
	return b.mem.view[offset : offset+int64(n)], nil
}

// Write and Read touch the shared pages directly: no rpc, no copy through the child.
func (b *isoBuffer) Write(offset int64, src []byte) error {
	dst, err := b.bytes("write", offset, len(src))
	if err == nil {
		copy(dst, src)
	}
	return err
}

func (b *isoBuffer) Read(offset int64, dst []byte) error {
	src, err := b.bytes("read", offset, len(dst))
	if err == nil {
		copy(dst, src)
	}
	return err
}

func (b *isoBuffer) Map() ([]byte, error) { return b.bytes("map", 0, len(b.mem.view)) }

func (b *isoBuffer) Unmap() error { return nil }

func (b *isoBuffer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	if b.c.pr.deadErr() == nil {
		if _, err := b.c.pr.callTimed("buffer_release", &rpcReq{Op: opBufferRelease, U: [6]uint64{b.h}}); err != nil {
			return err
		}
	}
	b.closed = true
	b.mem.close()
	b.c.adjust(-1)
	return nil
}

type isoExecutable struct {
	c        *isoContext
	h        uint64
	g        *core.Graph
	verdicts []core.NodeVerdict

	mu     sync.Mutex
	closed bool
}

func (e *isoExecutable) NewExecution() (core.Execution, error) {
	resp, err := e.c.pr.callTimed("execution_create", &rpcReq{Op: opExecutionCreate, U: [6]uint64{e.h}})
	if err != nil {
		return nil, err
	}
	return &isoExecution{e: e, h: resp.U[0], binds: make([]*isoBuffer, len(e.g.Inputs)+len(e.g.Outputs))}, nil
}

func (e *isoExecutable) Serialize() ([]byte, error) {
	resp, err := e.c.pr.callTimed("executable_serialize", &rpcReq{Op: opSerialize, U: [6]uint64{e.h}})
	if err != nil {
		return nil, err
	}
	return resp.B, nil
}

func (e *isoExecutable) Verdicts() []core.NodeVerdict {
	return append([]core.NodeVerdict(nil), e.verdicts...)
}

func (e *isoExecutable) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	if e.c.pr.deadErr() == nil {
		if _, err := e.c.pr.callTimed("executable_release", &rpcReq{Op: opExecutableRelease, U: [6]uint64{e.h}}); err != nil {
			return err
		}
	}
	e.closed = true
	e.c.adjust(-1)
	return nil
}

type isoExecution struct {
	e *isoExecutable
	h uint64

	mu    sync.Mutex
	binds []*isoBuffer
}

func (x *isoExecution) Bind(io int, buf core.Buffer, offset int64) error {
	b, ok := buf.(*isoBuffer)
	if !ok || b.c != x.e.c {
		return fmt.Errorf("bind io %d: the buffer is not of this executable's context: %w", io,
			core.ErrInvalidArgument)
	}
	t, err := x.e.g.Binding(io)
	if err != nil {
		return fmt.Errorf("bind %w", err)
	}
	// the tensor is named only on failure: Bind is on the decode loop (the KV rows move)
	if _, err := b.bytes("bind", offset, int(t.Bytes())); err != nil {
		return fmt.Errorf("io %d (%s): %w", io, t, err)
	}
	if _, err := x.e.c.pr.callTimed("execution_bind", &rpcReq{Op: opExecutionBind,
		U: [6]uint64{x.h, uint64(io), b.h, uint64(offset)}}); err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.binds == nil {
		return fmt.Errorf("bind io %d: execution is closed: %w", io, core.ErrBadState)
	}
	x.binds[io] = b
	return nil
}

// Run is one small message over the socket pair (or one small rpc while another run is in
// flight): the bytes are already in the shared buffers.
func (x *isoExecution) Run(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ok, err := x.e.c.pr.tryFastRun(ctx, x.h); ok {
		return err
	}
	_, err := x.e.c.pr.call(ctx, "execution_run", &rpcReq{Op: opExecutionRun, U: [6]uint64{x.h}})
	return err
}

func (x *isoExecution) Submit(waits []core.FencePoint, signal *core.FencePoint) error {
	req := &rpcReq{Op: opExecutionSubmit, U: [6]uint64{x.h}}
	for i, w := range waits {
		f, ok := w.Fence.(*isoFence)
		if !ok || f.c.pr != x.e.c.pr {
			return fmt.Errorf("submit: wait %d: fence is not of this backend: %w", i, core.ErrInvalidArgument)
		}
		req.F = append(req.F, abi.FencePoint{Fence: f.h, Value: w.Value})
	}
	if signal != nil {
		f, ok := signal.Fence.(*isoFence)
		if !ok || f.c.pr != x.e.c.pr {
			return fmt.Errorf("submit: signal: fence is not of this backend: %w", core.ErrInvalidArgument)
		}
		req.U[1], req.U[2], req.U[3] = 1, f.h, signal.Value
	}
	_, err := x.e.c.pr.callTimed("execution_submit", req)
	return err
}

func (x *isoExecution) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.binds == nil {
		return nil
	}
	if x.e.c.pr.deadErr() == nil {
		if _, err := x.e.c.pr.callTimed("execution_release", &rpcReq{Op: opExecutionRelease, U: [6]uint64{x.h}}); err != nil {
			return err
		}
	}
	x.binds = nil
	return nil
}

type isoFence struct {
	c *isoContext
	h uint64

	mu     sync.Mutex
	closed bool
}

// Wait forwards fence_wait in slices (abi.WaitSliced) so that a cancelled ctx is noticed
// promptly; a long wait is legitimate, so it never kills the child.
func (f *isoFence) Wait(ctx context.Context, value uint64) error {
	return abi.WaitSliced(ctx, func(slice time.Duration) (bool, error) {
		_, err := f.c.pr.callTimed("fence_wait", &rpcReq{Op: opFenceWait, U: [6]uint64{f.h, value, uint64(slice)}})
		return !errors.Is(err, core.ErrTimeout), err
	})
}

func (f *isoFence) Value() (uint64, error) {
	resp, err := f.c.pr.callTimed("fence_value", &rpcReq{Op: opFenceValue, U: [6]uint64{f.h}})
	if err != nil {
		return 0, err
	}
	return resp.U[0], nil
}

func (f *isoFence) Signal(value uint64) error {
	_, err := f.c.pr.callTimed("fence_signal", &rpcReq{Op: opFenceSignal, U: [6]uint64{f.h, value}})
	return err
}

func (f *isoFence) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	if f.c.pr.deadErr() == nil {
		if _, err := f.c.pr.callTimed("fence_release", &rpcReq{Op: opFenceRelease, U: [6]uint64{f.h}}); err != nil {
			return err
		}
	}
	f.closed = true
	f.c.adjust(-1)
	return nil
}

var _ io.Writer = (*ringLog)(nil)
