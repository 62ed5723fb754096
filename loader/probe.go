package loader

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/cachedir"
	"github.com/xpuhub/xpu/internal/safefile"
)

// Discovery never runs a plugin's code in the caller's process before that code has run
// safely elsewhere: each candidate is dlopened and probed in a short-lived child (the
// plugin-host entry point in probe mode) with a deadline. The answers are cached on disk, keyed
// by the file's path, size, modification time and SHA-256, so that a normal start-up starts no
// child at all. Only a plugin that probed safely is ever opened in this process.

// DefaultProbeTimeout bounds one probe child (dlopen, constructors, xpu_plugin_probe).
const DefaultProbeTimeout = 5 * time.Second

// defaultInspectTimeout bounds a child that also opens the plugin and lists its devices (an
// SDK's initialisation may take a while).
const defaultInspectTimeout = 30 * time.Second

// hostModeInspect is probe mode plus open and device listing (Inspect).
const hostModeInspect = "inspect"

// EnvCacheDir is the cache folder shared with the plugins (the OpenCL plugin keeps compiled
// programs there): XPU_CACHE_DIR, else $XDG_CACHE_HOME/xpu, else ~/.cache/xpu.
const EnvCacheDir = cachedir.Env

// probeChildren counts the probe children started (the tests' witness of the cache).
var probeChildren atomic.Int64

// probeConcurrency is how many probe children run at once.
const probeConcurrency = 8

// maxAnswer bounds what a probe child may print.
const maxAnswer = 1 << 20

// WithProbeTimeout bounds each candidate's probe child (default DefaultProbeTimeout).
func WithProbeTimeout(d time.Duration) Option { return func(c *config) { c.probeTimeout = d } }

// WithProbeCacheDir keeps probe results in dir ("" turns the cache off) instead of
// <cache folder>/probe (see EnvCacheDir).
func WithProbeCacheDir(dir string) Option {
	return func(c *config) { c.probeCache, c.probeCacheSet = dir, true }
}

// Rescan probes every candidate afresh, ignoring cached results (which are then replaced): for
// a plugin whose answer depends on something outside its file (a driver installed since).
func Rescan() Option { return func(c *config) { c.rescan = true } }

// ErrProbeFault: the probe child crashed, hung or exited without answering.
var ErrProbeFault = errors.New("plugin probe failed")

// probeAnswer is what a probe child prints (and what the cache keeps).
type probeAnswer struct {
	Result  abi.ProbeResult   `json:"result"`
	Err     string            `json:"err,omitempty"`  // abi.Probe's error (or Open's, in inspect mode)
	Kind    string            `json:"kind,omitempty"` // the core sentinel Err wraps
	Opened  bool              `json:"opened,omitempty"`
	Devices []core.DeviceInfo `json:"devices,omitempty"`
	// Fault is set by the parent (never by the child): the child crashed, hung or died.
	Fault     string `json:"fault,omitempty"`
	FaultKind string `json:"fault_kind,omitempty"`
}

// sentinels are the errors whose identity survives the trip through a probe child.
var sentinels = []error{core.ErrNotFound, core.ErrIncompatible, core.ErrUnsupported,
	core.ErrInvalidArgument, core.ErrMissingDependency, core.ErrBackendCrashed, core.ErrTimeout,
	core.ErrInternal, core.ErrBadState, core.ErrOutOfMemory, core.ErrDeviceLost}

func kindOf(err error) string {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return ""
}

// rebuild turns a message and kind back into an error that errors.Is recognises.
func rebuild(msg, kind string) error {
	for _, s := range sentinels {
		if s.Error() == kind {
			return fmt.Errorf("%s: %w", trimSentinel(msg, s), s)
		}
	}
	return errors.New(msg)
}

// trimSentinel drops the ": <sentinel>" that %w added, since rebuild adds it again.
func trimSentinel(msg string, s error) string {
	suffix := ": " + s.Error()
	if len(msg) > len(suffix) && msg[len(msg)-len(suffix):] == suffix {
		return msg[:len(msg)-len(suffix)]
	}
	return msg
}

// probeHere is the probe child's work, in the child.
func probeHere(path string, open bool) probeAnswer {
	var ans probeAnswer
	if err := checkRegular(path); err != nil {
		ans.Result.Path, ans.Err, ans.Kind = path, err.Error(), kindOf(err)
		return ans
	}
	res, err := abi.Probe(path)
	ans.Result = res
	if err != nil {
		ans.Err, ans.Kind = err.Error(), kindOf(err)
		return ans
	}
	if !open || res.Score <= 0 {
		return ans
	}
	p, err := abi.Open(path)
	if err != nil {
		ans.Err, ans.Kind = err.Error(), kindOf(err)
		return ans
	}
	defer p.Close()
	ans.Opened = true
	n, st := p.DeviceCount()
	if st != abi.StatusOK {
		err := p.Err("device_count", 0, st)
		ans.Err, ans.Kind = err.Error(), kindOf(err)
		return ans
	}
	for i := range n {
		d, st := p.DeviceInfo(i)
		if st != abi.StatusOK {
			err := p.Err("device_info", 0, st)
			ans.Err, ans.Kind = err.Error(), kindOf(err)
			return ans
		}
		ans.Devices = append(ans.Devices, d)
	}
	return ans
}

// checkRegular refuses anything but a regular file without opening it: a FIFO named
// libxpu-x.so would block the open (and with it discovery) forever.
func checkRegular(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("plugin %s: file missing: %w", path, core.ErrNotFound)
		}
		return fmt.Errorf("plugin %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		what := "not a regular file"
		switch {
		case st.IsDir():
			what = "a directory"
		case st.Mode()&os.ModeNamedPipe != 0:
			what = "a named pipe (FIFO)"
		case st.Mode()&os.ModeDevice != 0:
			what = "a device file"
		case st.Mode()&os.ModeSocket != 0:
			what = "a socket"
		}
		return fmt.Errorf("plugin %s: %s, not a regular file: refused without opening it: %w", path,
			what, core.ErrInvalidArgument)
	}
	return nil
}

// fileKey is the cache key of a plugin file: path, size, mtime and content hash. The file is
// opened non-blocking and checked to be regular on the open descriptor, so that a FIFO swapped
// in after checkRegular cannot block.
func fileKey(path string) (string, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s: not a regular file", path)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return fmt.Sprintf("xpu-probe-v1 abi%d %s %d %d %x", abi.ABIMajor, path, st.Size(),
		st.ModTime().UnixNano(), h.Sum(nil)), nil
}

// cacheDir is the probe cache folder ("" when there is none).
func (c *config) cacheDir() string {
	if c.probeCacheSet {
		return c.probeCache
	}
	d, err := cachedir.Dir("probe")
	if err != nil {
		return ""
	}
	return d
}

// cacheEntry is one cache file: the key it was made for and the answer.
type cacheEntry struct {
	Key    string      `json:"key"`
	Answer probeAnswer `json:"answer"`
}

// cacheFile is where path's answer is kept: one file per plugin path, so that a rebuilt
// plugin replaces its entry instead of adding one.
func cacheFile(dir, path string) string {
	sum := sha256.Sum256([]byte(path))
	return filepath.Join(dir, hex.EncodeToString(sum[:12])+".json")
}

func cacheLoad(dir, path, key string) (probeAnswer, bool) {
	b, err := safefile.ReadFile(cacheFile(dir, path))
	if err != nil {
		return probeAnswer{}, false
	}
	var e cacheEntry
	if json.Unmarshal(b, &e) != nil || e.Key != key {
		return probeAnswer{}, false
	}
	return e.Answer, true
}

// cacheStore writes the entry atomically (temp file + rename): a concurrent reader sees the
// old entry or the new one, never half of one.
func cacheStore(log *slog.Logger, dir, path, key string, ans probeAnswer) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Debug("loader: probe cache", "err", err)
		return
	}
	b, err := json.Marshal(cacheEntry{Key: key, Answer: ans})
	if err != nil {
		return
	}
	if err := writeAtomic(cacheFile(dir, path), b); err != nil {
		log.Debug("loader: probe cache", "err", err)
	}
	pruneOnce.Do(func() { go prune(dir) })
}

// writeAtomic writes b to path through a temporary file in the same folder and a rename.
func writeAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

var pruneOnce sync.Once

// prune removes the entries of plugin files that no longer exist (test plugins built in
// temporary folders would otherwise pile up), once per process.
func prune(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		b, err := safefile.ReadFile(p)
		if err != nil {
			continue
		}
		var ce cacheEntry
		if json.Unmarshal(b, &ce) != nil {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Hour {
				os.Remove(p) // junk, or a temp file a killed process left
			}
			continue
		}
		if _, err := os.Stat(ce.Answer.Result.Path); errors.Is(err, os.ErrNotExist) {
			os.Remove(p)
		}
	}
}

// probeFile probes one plugin file: from the cache, else in a child. The error is about the
// child (it could not start, or ctx ended); what the probe found, including a crash or a hang,
// is in the answer.
func (c *config) probeFile(ctx context.Context, path string) (probeAnswer, error) {
	if err := checkRegular(path); err != nil {
		return probeAnswer{Result: abi.ProbeResult{Path: path}, Err: err.Error(), Kind: kindOf(err)}, nil
	}
	dir := c.cacheDir()
	key, kerr := fileKey(path)
	if kerr != nil {
		dir = ""
	}
	if dir != "" && !c.rescan {
		if ans, ok := cacheLoad(dir, path, key); ok {
			logOrDefault(c.logger).Debug("loader: probe from cache", "path", path)
			return ans, nil
		}
	}
	timeout := c.probeTimeout
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	ans, cacheable, err := c.runProbeChild(ctx, path, hostModeProbe, timeout)
	if err != nil {
		return ans, err
	}
	if dir != "" && cacheable {
		cacheStore(logOrDefault(c.logger), dir, path, key, ans)
	}
	return ans, nil
}

// runProbeChild runs one probe child for path. cacheable says whether the outcome belongs to
// the plugin file (an answer, a crash) rather than to this run (a timeout, which a loaded
// machine can cause, or an exit without an answer).
func (c *config) runProbeChild(ctx context.Context, path, mode string, timeout time.Duration) (ans probeAnswer, cacheable bool, err error) {
	ans.Result.Path = path
	bin, err := c.hostPath()
	if err != nil {
		return ans, false, fmt.Errorf("probing %s: no plugin-host executable: %w", path, err)
	}
	args := []string{"plugin-host", "--probe", path}
	if mode == hostModeInspect {
		args = []string{"plugin-host", "--probe", "--open", path}
	}
	cmd, err := hostCommand(bin, args, envChildPlugin+"="+path, envHostMode+"="+mode,
		handshake.MagicCookieKey+"="+handshake.MagicCookieValue)
	if err != nil {
		return ans, false, fmt.Errorf("probing %s: %w", path, err)
	}
	var out capped
	logs := &ringLog{name: filepath.Base(path)}
	cmd.Stdout, cmd.Stderr = &out, logs
	cmd.WaitDelay = time.Second // a grandchild holding the pipes must not hold us
	start := time.Now()
	probeChildren.Add(1)
	if err := cmd.Start(); err != nil {
		return ans, false, fmt.Errorf("probing %s: starting %s: %v: %w", path, bin, err, core.ErrInternal)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var werr error
	select {
	case werr = <-done:
		killTree(cmd) // whatever the plugin left running in the group
	case <-timer.C:
		killTree(cmd)
		<-done
		ans.Fault = fmt.Sprintf("probe hung: no answer within %v, killed", timeout)
		ans.FaultKind = core.ErrTimeout.Error()
		// not cached: a probe that is only slow (a loaded machine) must not disable the
		// plugin on every later start; the next discovery probes it again
		return ans, false, nil
	case <-ctx.Done():
		killTree(cmd)
		<-done
		return ans, false, fmt.Errorf("probing %s: %w", path, ctx.Err())
	}
	logOrDefault(c.logger).Debug("loader: probe child", "path", path, "mode", mode, "took", time.Since(start), "err", werr)
	if errors.Is(werr, exec.ErrWaitDelay) {
		werr = nil // the child exited well; something it started held its pipes (now killed)
	}
	// Wait has drained the pipes: the child's last words are all in logs
	var ee *exec.ExitError
	switch {
	case errors.As(werr, &ee):
		ws, _ := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			ans.Fault = fmt.Sprintf("probe crashed (killed by %v); its last output: %s", ws.Signal(), oneLine(logs.last()))
			ans.FaultKind = core.ErrBackendCrashed.Error()
			return ans, true, nil
		}
		// the Go runtime turns a fatal signal in C code into a crash report and exit status 2
		if m := goCrash.FindStringSubmatch(logs.last()); m != nil {
			ans.Fault = fmt.Sprintf("probe crashed (%s)", m[1])
			ans.FaultKind = core.ErrBackendCrashed.Error()
			return ans, true, nil
		}
		// abi's exit guard: the plugin called exit() (the message names the call)
		if ee.ExitCode() == abi.ExitStatusPluginExit {
			ans.Fault = fmt.Sprintf("probe child exited with status %d: %s", ee.ExitCode(), oneLine(logs.last()))
			ans.FaultKind = core.ErrBackendCrashed.Error()
			return ans, true, nil
		}
		// another exit status without an answer: the plugin called _exit(), or the host
		// executable does not serve probes; not cached, since it may be the latter
		ans.Fault = fmt.Sprintf("probe child exited with status %d without answering (did the plugin call exit()?); its last output: %s",
			ee.ExitCode(), oneLine(logs.last()))
		ans.FaultKind = core.ErrBackendCrashed.Error()
		return ans, false, nil
	case werr != nil:
		return ans, false, fmt.Errorf("probing %s: %v: %w", path, werr, core.ErrInternal)
	}
	var got probeAnswer
	if out.over || json.Unmarshal(bytes.TrimSpace(out.buf.Bytes()), &got) != nil {
		ans.Fault = fmt.Sprintf("probe child exited without a readable answer (did the plugin call exit(0)?); its last output: %s",
			oneLine(logs.last()))
		ans.FaultKind = core.ErrBackendCrashed.Error()
		return ans, false, nil
	}
	got.Fault, got.FaultKind = "", ""
	return got, true, nil
}

// oneLine joins a child's last lines into one, for a candidate's Reason.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " | ")), " ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// goCrash matches the first line of a Go crash report caused by a signal.
var goCrash = regexp.MustCompile(`(?m)^(SIG[A-Z]+: .*)$`)

// capped is a bounded output buffer.
type capped struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	over bool
}

func (w *capped) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len()+len(b) > maxAnswer {
		w.over = true
		return len(b), nil
	}
	return w.buf.Write(b)
}

// answerErr is the error an answer carries: a fault of the child, or the probe's own error.
func (a probeAnswer) answerErr() error {
	if a.Fault != "" {
		return fmt.Errorf("plugin %s: %w: %w", a.Result.Path, ErrProbeFault, rebuild(a.Fault, a.FaultKind))
	}
	if a.Err != "" {
		return rebuild(a.Err, a.Kind)
	}
	return nil
}

// Inspect opens a candidate in a child process (never in this one) and returns its devices:
// what `xpu devices` lists, without letting a plugin that crashes or hangs in open take the
// caller down. A plugin that opens with no device is an error (core.ErrUnsupported).
func Inspect(ctx context.Context, cd Candidate, opts ...Option) ([]core.DeviceInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := refuseInPluginHost(); err != nil {
		return nil, err
	}
	c := newConfig(opts)
	if err := checkRegular(cd.Path); err != nil {
		return nil, err
	}
	ans, _, err := c.runProbeChild(ctx, cd.Path, hostModeInspect, defaultInspectTimeout)
	if err != nil {
		return nil, err
	}
	if err := ans.answerErr(); err != nil {
		return nil, err
	}
	if ans.Result.Score <= 0 {
		return nil, fmt.Errorf("plugin %s (%s) cannot run here: %s: %w", cd.Path, ans.Result.Name,
			ans.Result.Reason, core.ErrUnsupported)
	}
	if len(ans.Devices) == 0 {
		return nil, zeroDevices(cd.Path, ans.Result.Name)
	}
	return ans.Devices, nil
}

// zeroDevices is the error of a plugin that opened with no device.
func zeroDevices(path, name string) error {
	return fmt.Errorf("plugin %s (%s) opened with 0 devices: %w", path, name, core.ErrUnsupported)
}

// probeCandidate turns a discovered file into a candidate.
func (c *config) probeCandidate(ctx context.Context, f searchDir) (Candidate, error) {
	cd := Candidate{Path: f.path, Source: f.source}
	ans, err := c.probeFile(ctx, f.path)
	if err != nil {
		if ctx.Err() != nil {
			return cd, ctx.Err()
		}
		cd.Err, cd.Reason = err, err.Error()
		return cd, nil
	}
	res := ans.Result
	cd.Name, cd.Score, cd.Reason = res.Name, res.Score, res.Reason
	if err := ans.answerErr(); err != nil {
		cd.Err, cd.Reason = err, err.Error()
		if ans.Fault != "" {
			cd.Name, cd.Score = "", 0
		}
	} else if res.Score <= 0 && cd.Reason == "" {
		cd.Reason = "probe scored 0 without a reason"
	}
	logOrDefault(c.logger).Debug("loader: candidate", "path", cd.Path, "name", cd.Name, "score", cd.Score,
		"reason", cd.Reason)
	return cd, nil
}

// probeAll probes files concurrently (bounded), each candidate in its place.
func (c *config) probeAll(ctx context.Context, files []searchDir) ([]Candidate, error) {
	cands := make([]Candidate, len(files))
	errs := make([]error, len(files))
	sem := make(chan struct{}, probeConcurrency)
	var wg sync.WaitGroup
	for i, f := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			cands[i], errs[i] = c.probeCandidate(ctx, f)
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return cands, nil
}
