package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"

	"github.com/xpuhub/xpu/abi"
)

// A plugin loaded in-process that crashes (a segfault in its code) takes the process down with
// a Go runtime report that names no plugin. The crash monitor is a small child (this binary,
// `xpu crash-monitor`) that receives the runtime's crash report (debug.SetCrashOutput) and the
// plugin libraries as they load; when the report comes, it finds the library holding the
// faulting address and prints which plugin crashed and how to run it isolated.

// crashMonitorCmd is the hidden command the monitor child runs.
const crashMonitorCmd = "crash-monitor"

// pluginLine marks a plugin load in the monitor's input; the runtime's report never starts with
// a NUL.
const pluginLine = "\x00plugin\t"

func init() {
	register(&command{name: crashMonitorCmd, hidden: true,
		summary: "receive the crash report of the xpu process that started it (internal)",
		run: func(_ context.Context, args []string, _, stderr io.Writer) int {
			ppid := os.Getppid()
			if len(args) == 1 {
				if n, err := strconv.Atoi(args[0]); err == nil {
					ppid = n
				}
			}
			crashMonitor(os.Stdin, stderr, ppid)
			return 0
		}})
}

// startCrashMonitor starts the monitor child for this process, unless cmd is one that loads no
// plugin in-process or the variable XPU_CRASH_MONITOR is 0. Failing to start it changes nothing
// but the report.
func startCrashMonitor(cmd string) {
	if cmd == crashMonitorCmd || cmd == "plugin-host" || os.Getenv("XPU_CRASH_MONITOR") == "0" {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	r, w, err := os.Pipe()
	if err != nil {
		return
	}
	c := exec.Command(exe, crashMonitorCmd, strconv.Itoa(os.Getpid()))
	c.Stdin, c.Stderr = r, os.Stderr
	if err := c.Start(); err != nil {
		r.Close()
		w.Close()
		return
	}
	r.Close()
	go func() { _ = c.Wait() }() // reaped if this process outlives it; it exits at our exit
	if err := debug.SetCrashOutput(w, debug.CrashOptions{}); err != nil {
		w.Close()
		return
	}
	var mu sync.Mutex
	abi.OnLoad(func(path string) {
		mu.Lock()
		defer mu.Unlock()
		_, _ = io.WriteString(w, pluginLine+path+"\n")
	})
	// w stays open for the process's life: its close at exit is the monitor's end of input
}

type libRange struct {
	lo, hi uint64
	path   string
}

// crashMonitor reads the plugin loads and the crash report from in (until the watched process
// pid exits) and, when a report came, writes which plugin crashed to w.
func crashMonitor(in io.Reader, w io.Writer, pid int) {
	var ranges []libRange
	var plugins []string
	var report bytes.Buffer
	br := bufio.NewReader(in)
	for {
		line, err := br.ReadString('\n')
		if path, ok := strings.CutPrefix(line, pluginLine); ok && strings.HasSuffix(path, "\n") {
			path = strings.TrimSuffix(path, "\n")
			plugins = append(plugins, path)
			ranges = append(ranges, mappedRanges(pid, path)...)
		} else {
			report.WriteString(line)
		}
		if err != nil {
			break
		}
	}
	if msg := crashHint(report.String(), ranges, plugins); msg != "" {
		fmt.Fprint(w, msg)
	}
}

// mappedRanges are the address ranges of path in process pid's memory map.
func mappedRanges(pid int, path string) []libRange {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil
	}
	var out []libRange
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 6 || f[len(f)-1] != path {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		a, err1 := strconv.ParseUint(lo, 16, 64)
		z, err2 := strconv.ParseUint(hi, 16, 64)
		if ok && err1 == nil && err2 == nil {
			out = append(out, libRange{a, z, path})
		}
	}
	return out
}

var crashPC = regexp.MustCompile(`(?m)^PC=0x([0-9a-f]+)`)

// crashHint is the monitor's message for a crash report (none for an empty report or one whose
// crash is not in plugin code).
func crashHint(report string, ranges []libRange, plugins []string) string {
	if strings.TrimSpace(report) == "" || len(plugins) == 0 {
		return ""
	}
	external := strings.Contains(report, "signal arrived during external code execution") ||
		strings.Contains(report, "signal arrived during cgo execution")
	culprit := ""
	if m := crashPC.FindStringSubmatch(report); m != nil {
		if pc, err := strconv.ParseUint(m[1], 16, 64); err == nil {
			for _, r := range ranges {
				if pc >= r.lo && pc < r.hi {
					culprit = r.path
				}
			}
		}
	}
	const isolate = "Run it isolated to keep its crashes out of the process: --isolated (xpu run, serve, conform), or XPU_ISOLATE=%s (every command).\n"
	switch {
	case culprit != "":
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(culprit), "libxpu-"), ".so")
		return fmt.Sprintf("\nxpu: the plugin %s crashed the process (the fault is in its code; the report above is the Go runtime's).\n"+isolate,
			culprit, name)
	case external:
		return fmt.Sprintf("\nxpu: the process crashed in code outside Go, probably a plugin (loaded: %s).\n"+isolate,
			strings.Join(plugins, ", "), "all")
	}
	return ""
}
