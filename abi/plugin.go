package abi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/safefile"
)

// ABI version this host speaks, as XPU_ABI_MAJOR / XPU_ABI_MINOR.
const (
	ABIMajor = 1
	ABIMinor = 1
)

// Exported symbol names every plugin has.
const (
	SymProbe = "xpu_plugin_probe"
	SymOpen  = "xpu_plugin_open"
)

// ProbeResult is what xpu_plugin_probe answered.
type ProbeResult struct {
	Path     string
	ABIMajor uint32
	ABIMinor uint32
	Score    int
	Name     string
	Reason   string
}

// PluginInfo is xpu_plugin_info in Go.
type PluginInfo struct {
	ABIMajor, ABIMinor   uint32
	OpsetMin, OpsetMax   uint32
	IRVersion            uint32
	Name, Vendor         string
	Version, BuildID     string
	SDKVersion           string
	TableEntries         int // entries the plugin's function table holds
	TableEntriesKnown    int // entries this host knows
	TableStructSizeBytes uint32
}

// library is a dlopen'ed plugin file. The host never dlcloses a plugin (ABI rule), so one
// library per path lives for the whole process and is shared by every Open of that path.
type library struct {
	path   string
	handle uintptr
	probe  func(out *cProbeResult) int32
	open   func(host *cHostInfo, out **cAPI) int32
}

var libraries struct {
	sync.Mutex
	byPath map[string]*library
	open   map[string]*Plugin // plugins opened and not yet shut down
}

// loadLibrary dlopens path (once per process) and resolves the two exports.
func loadLibrary(path string) (lib *library, err error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", path, err)
	}
	libraries.Lock()
	defer libraries.Unlock()
	if l, ok := libraries.byPath[abs]; ok {
		return l, nil
	}
	// a FIFO or device named like a plugin would block the open below forever
	if st, err := os.Stat(abs); err == nil && !st.Mode().IsRegular() && !st.IsDir() {
		return nil, fmt.Errorf("plugin %s: not a regular file (%v): %w", path, st.Mode().Type(),
			core.ErrInvalidArgument)
	}
	f, err := safefile.Open(abs) // non-blocking: a FIFO swapped in after the Stat is refused too
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("plugin %s: file missing: %w", path, core.ErrNotFound)
		}
		return nil, fmt.Errorf("plugin %s: %w", path, err)
	}
	st, err := f.Stat()
	if err == nil && st.IsDir() {
		err = fmt.Errorf("is a directory: %w", core.ErrInvalidArgument)
	}
	if err == nil {
		err = checkELF(f)
	}
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", path, err)
	}
	defer recoverTo(&err)
	installExitGuard() // before any plugin code (constructors included) runs
	h, err := purego.Dlopen(abs, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: dlopen: %v: %w", path, err, core.ErrIncompatible)
	}
	lib = &library{path: abs, handle: h}
	for _, sym := range []struct {
		name string
		fn   any
	}{{SymProbe, &lib.probe}, {SymOpen, &lib.open}} {
		addr, err := purego.Dlsym(h, sym.name)
		if err != nil || addr == 0 {
			return nil, fmt.Errorf("plugin %s: missing export %s (not an xpu plugin?): %w", path,
				sym.name, core.ErrIncompatible)
		}
		purego.RegisterFunc(sym.fn, addr)
	}
	if libraries.byPath == nil {
		libraries.byPath = map[string]*library{}
		libraries.open = map[string]*Plugin{}
	}
	libraries.byPath[abs] = lib
	notifyLoad(abs)
	return lib, nil
}

var loadHooks struct {
	sync.Mutex
	fns    []func(path string)
	loaded []string
}

// OnLoad registers f to be called with the absolute path of every plugin library this process
// loads in-process, those loaded before the call included: a crash reporter maps a faulting
// address to the plugin it belongs to. f runs on the loading goroutine; it must be quick.
func OnLoad(f func(path string)) {
	loadHooks.Lock()
	defer loadHooks.Unlock()
	loadHooks.fns = append(loadHooks.fns, f)
	for _, p := range loadHooks.loaded {
		f(p)
	}
}

func notifyLoad(path string) {
	loadHooks.Lock()
	defer loadHooks.Unlock()
	loadHooks.loaded = append(loadHooks.loaded, path)
	for _, f := range loadHooks.fns {
		f(path)
	}
}

// recoverTo turns a panic at the purego boundary into ErrInternal: no panic crosses the API.
func recoverTo(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("abi: panic at the plugin boundary: %v: %w", r, core.ErrInternal)
	}
}

// Probe loads the plugin at path and calls xpu_plugin_probe. It returns an error when the file
// cannot be a plugin (missing, not a shared library, wrong architecture, missing export, probe
// failed). A score of 0 is no error: the result says why in Reason.
func Probe(path string) (res ProbeResult, err error) {
	lib, err := loadLibrary(path)
	if err != nil {
		return ProbeResult{Path: path}, err
	}
	return lib.callProbe()
}

func (l *library) callProbe() (res ProbeResult, err error) {
	res.Path = l.path
	defer recoverTo(&err)
	var out cProbeResult
	out.StructSize = uint32(unsafe.Sizeof(out))
	enterCall(l.path, SymProbe)
	st := Status(l.probe(&out))
	leaveCall()
	res.ABIMajor, res.ABIMinor = out.ABIMajor, out.ABIMinor
	res.Score = int(out.Score)
	res.Name = goString(out.Name[:])
	res.Reason = goString(out.Reason[:])
	if st != StatusOK {
		return res, fmt.Errorf("plugin %s: %s failed: %w", l.path, SymProbe, st.Err(res.Reason))
	}
	if res.ABIMajor != ABIMajor {
		return res, fmt.Errorf("plugin %s (%s): ABI major %d, this host speaks %d.%d: %w", l.path,
			res.Name, res.ABIMajor, ABIMajor, ABIMinor, core.ErrIncompatible)
	}
	if res.Name == "" {
		return res, fmt.Errorf("plugin %s: probe gave no backend name: %w", l.path, core.ErrIncompatible)
	}
	return res, nil
}

// logSink is the one purego callback every plugin's log goes to (purego callbacks are never
// freed and are limited per process, so it is made once). log_user is the index of the
// plugin name in logNames.
var logSink struct {
	once  sync.Once
	fn    uintptr
	mu    sync.Mutex
	names []string
}

func logCallback() uintptr {
	logSink.once.Do(func() {
		logSink.fn = purego.NewCallback(func(user uintptr, level int32, msg *byte) {
			logSink.mu.Lock()
			name := "?"
			if int(user) < len(logSink.names) {
				name = logSink.names[user]
			}
			logSink.mu.Unlock()
			// A plugin's info lines (which build it opened, which provider) are detail for
			// whoever debugs the host: the library logs nothing at Info by default.
			lvl := slog.LevelDebug
			switch level {
			case 2:
				lvl = slog.LevelWarn
			case 3:
				lvl = slog.LevelError
			}
			slog.Default().Log(context.Background(), lvl, cStringAt(msg, 4096), "plugin", name)
		})
	})
	return logSink.fn
}

func logUser(name string) uintptr {
	logSink.mu.Lock()
	defer logSink.mu.Unlock()
	for i, n := range logSink.names {
		if n == name {
			return uintptr(i)
		}
	}
	logSink.names = append(logSink.names, name)
	return uintptr(len(logSink.names) - 1)
}

// Plugin is an opened plugin: the function table, bound with purego, presented as one method
// per entry that takes and returns handles and Go values (the raw API the conformance suite's
// ABI tests use; Backend presents the same plugin as a core.Backend).
type Plugin struct {
	lib    *library
	probe  ProbeResult
	table  cAPI // copy of the plugin's table, entries past its struct_size zeroed
	n      int  // entries present
	fn     funcs
	dirC   *byte // plugin_dir given at open; kept for the plugin's lifetime
	info   PluginInfo
	mu     sync.Mutex
	refs   int
	closed bool // every opener called Close
	down   bool // shutdown was called: the table must not be called again
	// the exit guard's call sites of the hot entries, made once (callDirect)
	siteBind, siteRun callSite
}

// Open loads the plugin at path, checks its probe (ABI major, score > 0) and calls
// xpu_plugin_open. Opening the same file twice returns the same Plugin until every opener has
// closed it.
func Open(path string) (p *Plugin, err error) {
	lib, err := loadLibrary(path)
	if err != nil {
		return nil, err
	}
	libraries.Lock()
	if p, ok := libraries.open[lib.path]; ok {
		p.mu.Lock()
		p.refs++
		p.mu.Unlock()
		libraries.Unlock()
		return p, nil
	}
	libraries.Unlock()

	res, err := lib.callProbe()
	if err != nil {
		return nil, err
	}
	if res.Score <= 0 {
		reason := res.Reason
		if reason == "" {
			reason = "no reason given"
		}
		return nil, fmt.Errorf("plugin %s (%s) cannot run here: %s: %w", path, res.Name, reason,
			core.ErrUnsupported)
	}
	p = &Plugin{lib: lib, probe: res, refs: 1, dirC: cString(filepath.Dir(lib.path))}
	if err := p.open(); err != nil {
		return nil, err
	}
	libraries.Lock()
	defer libraries.Unlock()
	if q, ok := libraries.open[lib.path]; ok { // lost a race with another Open of this file
		q.mu.Lock()
		q.refs++
		q.mu.Unlock()
		return q, nil
	}
	libraries.open[lib.path] = p
	return p, nil
}

func (p *Plugin) open() (err error) {
	defer recoverTo(&err)
	host := cHostInfo{ABIMajor: ABIMajor, ABIMinor: ABIMinor, Log: logCallback(),
		LogUser: logUser(p.probe.Name), PluginDir: p.dirC}
	host.StructSize = uint32(unsafe.Sizeof(host))
	var tbl *cAPI
	enterCall(p.probe.Name, SymOpen)
	st := Status(p.lib.open(&host, &tbl))
	leaveCall()
	if st != StatusOK {
		return fmt.Errorf("plugin %s (%s): %s failed: %w", p.lib.path, p.probe.Name, SymOpen,
			st.Err(p.lastErrorFromTable(tbl)))
	}
	if tbl == nil {
		return fmt.Errorf("plugin %s: %s returned no function table: %w", p.lib.path, SymOpen,
			core.ErrIncompatible)
	}
	if tbl.ABIMajor != ABIMajor {
		return fmt.Errorf("plugin %s: function table has ABI major %d, want %d: %w", p.lib.path,
			tbl.ABIMajor, ABIMajor, core.ErrIncompatible)
	}
	size := tbl.StructSize
	if size < apiHeaderSize {
		return fmt.Errorf("plugin %s: function table struct_size %d is smaller than its header: %w",
			p.lib.path, size, core.ErrIncompatible)
	}
	// copy at most the part both sides know; entries past the plugin's size stay 0 (missing)
	n := min(uintptr(size), unsafe.Sizeof(p.table))
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&p.table)), n), unsafe.Slice((*byte)(unsafe.Pointer(tbl)), n))
	p.table.StructSize = size
	p.n = int(n-apiHeaderSize) / int(unsafe.Sizeof(uintptr(0)))
	p.fn.bind(&p.table)
	p.siteBind, p.siteRun = callSite{p.probe.Name, "execution_bind"}, callSite{p.probe.Name, "execution_run"}
	if p.info, err = p.getInfo(); err != nil {
		if p.fn.shutdown != nil { // opened but unusable: let it release what open made
			p.fn.shutdown()
		}
		return err
	}
	return nil
}

// lastErrorFromTable reads last_error(0) when open failed but still handed back a table that
// has the entry: that is where a plugin explains why open failed.
func (p *Plugin) lastErrorFromTable(tbl *cAPI) string {
	if tbl == nil || tbl.StructSize < apiHeaderSize+3*8 || tbl.LastError == 0 {
		return ""
	}
	var f funcs
	purego.RegisterFunc(&f.lastError, tbl.LastError)
	return lastErrorWith(f.lastError, 0)
}

func lastErrorWith(fn func(uint64, *byte, uint32, *uint32) int32, h uint64) string {
	if fn == nil {
		return ""
	}
	buf := make([]byte, 1024)
	var n uint32
	if Status(fn(h, &buf[0], uint32(len(buf)), &n)) != StatusOK {
		return ""
	}
	return goString(buf)
}

func (p *Plugin) getInfo() (PluginInfo, error) {
	var out cPluginInfo
	out.StructSize = uint32(unsafe.Sizeof(out))
	st := p.call("get_info", p.fn.getInfo != nil, func() int32 { return p.fn.getInfo(&out) })
	if st != StatusOK {
		return PluginInfo{}, fmt.Errorf("plugin %s: get_info: %w", p.lib.path, st.Err(p.LastError(0)))
	}
	return PluginInfo{
		ABIMajor: out.ABIMajor, ABIMinor: out.ABIMinor, OpsetMin: out.OpsetMin,
		OpsetMax: out.OpsetMax, IRVersion: out.IRVersion,
		Name: goString(out.Name[:]), Vendor: goString(out.Vendor[:]),
		Version: goString(out.Version[:]), BuildID: goString(out.BuildID[:]),
		SDKVersion: goString(out.SDKVersion[:]), TableEntries: p.n,
		TableEntriesKnown: len(entryNames), TableStructSizeBytes: p.table.StructSize,
	}, nil
}

// Path is the plugin file.
func (p *Plugin) Path() string { return p.lib.path }

// ProbeResult is what the plugin's probe answered when it was opened.
func (p *Plugin) ProbeResult() ProbeResult { return p.probe }

// Info is what get_info answered at open.
func (p *Plugin) Info() PluginInfo { return p.info }

// Close drops one reference; the last one calls shutdown. The library stays loaded (the host
// never dlcloses a plugin) and may be opened again.
func (p *Plugin) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.refs--
	last := p.refs <= 0
	if last {
		p.closed = true
	}
	p.mu.Unlock()
	if !last {
		return nil
	}
	libraries.Lock()
	if libraries.open[p.lib.path] == p {
		delete(libraries.open, p.lib.path)
	}
	libraries.Unlock()
	if st := p.Shutdown(); st != StatusOK && st != StatusUnsupported {
		return fmt.Errorf("plugin %s: shutdown: %w", p.lib.path, st.Err(p.LastError(0)))
	}
	return nil
}
