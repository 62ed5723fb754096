package abi

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/ebitengine/purego"
)

// ExitStatusPluginExit is the exit status of a process in which a plugin called the C
// library's exit(): a plugin must never end its host, and a status of 0 (a plugin's exit(0))
// would make a run that stopped half way look like success.
const ExitStatusPluginExit = 70

// The exit guard: the first time a plugin library is loaded, a handler is registered with the
// C library's exit handlers (on_exit, else __cxa_atexit). Go's own exit (os.Exit, return from
// main) is the exit_group system call and never runs them (checked by abi's tests), so the
// handler runs only when C code, i.e. a plugin, calls exit(), in a call or from a thread of its
// own. It prints which plugin and call were in flight and ends the process with
// ExitStatusPluginExit. The one exception is a -race build, whose Go exit ends in the C
// library's exit: there the guard looks at the stack to tell Go's exit from a plugin's.

var exitGuard struct {
	once     sync.Once
	inFlight atomic.Int32
	last     atomic.Pointer[callSite]
}

type callSite struct{ plugin, entry string }

// enterCall records a plugin call in flight for the exit guard; leaveCall ends it.
func enterCall(plugin, entry string) { enterSite(&callSite{plugin, entry}) }

// enterSite is enterCall with a call site made beforehand (no allocation per call).
func enterSite(s *callSite) {
	exitGuard.inFlight.Add(1)
	exitGuard.last.Store(s)
}

func leaveCall() { exitGuard.inFlight.Add(-1) }

// libcNames are the C libraries the guard registers with, by platform.
func libcNames() []string {
	switch runtime.GOOS {
	case "darwin":
		return []string{"/usr/lib/libSystem.B.dylib"}
	default:
		return []string{"libc.so.6", "libc.so"}
	}
}

// installExitGuard registers the guard once per process. A platform without the registration
// functions keeps working unguarded (logged at debug level).
func installExitGuard() {
	exitGuard.once.Do(func() {
		var libc uintptr
		var err error
		for _, n := range libcNames() {
			if libc, err = purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
				break
			}
		}
		if libc == 0 {
			slog.Debug("abi: no exit guard: C library not found", "err", err)
			return
		}
		// on_exit passes the status exit() was given; __cxa_atexit (with no DSO: run at exit)
		// is what atexit, a static wrapper in glibc, calls
		if sym, err := purego.Dlsym(libc, "on_exit"); err == nil && sym != 0 {
			var onExit func(fn, arg uintptr) int32
			purego.RegisterFunc(&onExit, sym)
			onExit(purego.NewCallback(func(status, _ uintptr) { pluginExited(int(int32(status)), true) }), 0)
			return
		}
		if sym, err := purego.Dlsym(libc, "__cxa_atexit"); err == nil && sym != 0 {
			var cxaAtexit func(fn, arg, dso uintptr) int32
			purego.RegisterFunc(&cxaAtexit, sym)
			cxaAtexit(purego.NewCallback(func(uintptr) { pluginExited(0, false) }), 0, 0)
			return
		}
		slog.Debug("abi: no exit guard: neither on_exit nor __cxa_atexit found")
	})
}

// fromGoExit tells whether this exit handler runs inside Go's own exit: the goroutine that
// called into the C exit is then in os.Exit (the race runtime's finish calls the C exit).
func fromGoExit() bool {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if f.Function == "runtime.racefini" || f.Function == "os.Exit" {
			return true
		}
		if !more {
			return false
		}
	}
}

// pluginExited is the guard's handler: it runs inside the C library's exit().
func pluginExited(status int, known bool) {
	if goExitRunsCExit && fromGoExit() {
		return // Go's own exit, through the race runtime
	}
	what := "exit()"
	if known {
		what = fmt.Sprintf("exit(%d)", status)
	}
	msg := fmt.Sprintf("xpu: a plugin called %s, which would end this process", what)
	if site := exitGuard.last.Load(); exitGuard.inFlight.Load() > 0 && site != nil {
		msg = fmt.Sprintf("xpu: plugin %s called %s during %s, which would end this process", site.plugin,
			what, site.entry)
	} else if site != nil {
		msg += fmt.Sprintf(" (no call was in flight; the last call was %s %s)", site.plugin, site.entry)
	}
	msg += fmt.Sprintf("; exiting with status %d instead (isolate the plugin to survive this: --isolated, XPU_ISOLATE)\n",
		ExitStatusPluginExit)
	os.Stderr.WriteString(msg)
	// the raw exit: os.Exit would, under -race, re-enter the C library's exit we are inside of
	syscall.Exit(ExitStatusPluginExit)
}
