package loader

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"syscall"
)

// The plugin-host entry point. The loader starts plugin hosts from its own executable (or
// WithHostBinary / XPU_PLUGIN_HOST) in three modes: "probe" (discovery's short-lived child that
// dlopens and probes one plugin file, so that a plugin whose constructor or probe crashes or
// hangs cannot take the caller down), "inspect" (probe, open and list the devices: `xpu
// devices`, Inspect) and "serve" (the child of an isolated backend).
//
// Probe mode needs no wiring in a Go application (or a test binary) that embeds the loader:
// this package's init recognises a probe child by its environment (the handshake cookie and
// XPU_PLUGIN_HOST_MODE, set only by the loader), probes and exits before the application's
// main runs. Probing calls no host callback, so it is safe during package initialisation.
// Inspect and serve modes open the plugin, whose threads call back into Go (the log sink), and
// such a callback from a thread Go did not create blocks until package initialisation is done:
// those modes run from main. An application that uses isolation or Inspect therefore calls
// ServeIfPluginHost first thing in main, or points WithHostBinary / XPU_PLUGIN_HOST at an xpu
// binary (whose hidden `xpu plugin-host` command is PluginHostMain). One that does neither
// gets ErrInPluginHost from the child instead of a child that forks again.

func init() {
	if os.Getenv(envHostMode) == hostModeProbe &&
		os.Getenv(handshake.MagicCookieKey) == handshake.MagicCookieValue {
		// syscall.Exit, not os.Exit: under -race os.Exit finishes the race runtime through the C
		// library's exit, whose handlers (abi's exit guard) cannot call Go before init is done
		syscall.Exit(hostMain(hostModeProbe, os.Getenv(envChildPlugin), os.Stdout, os.Stderr))
	}
}

// ServeIfPluginHost does a plugin host's work and exits when the loader started this process
// as one (WithHostBinary defaults to the running executable); otherwise it returns at once. A
// Go application that opens isolated backends (Isolated, XPU_ISOLATE) or calls Inspect calls
// it first thing in main:
//
//	func main() {
//		loader.ServeIfPluginHost()
//		...
//	}
func ServeIfPluginHost() {
	mode := os.Getenv(envHostMode)
	if mode == "" || os.Getenv(handshake.MagicCookieKey) != handshake.MagicCookieValue {
		return
	}
	os.Exit(hostMain(mode, os.Getenv(envChildPlugin), os.Stdout, os.Stderr))
}

// PluginHostMain runs `plugin-host [--probe [--open]] <plugin file>` and returns the exit
// status: without flags it serves the plugin to an isolated backend's parent; with --probe it
// probes the file (with --open also opens it and lists its devices) and prints the answer as
// JSON on stdout. Only the loader starts these (they refuse to run without the loader's
// handshake environment). ServeIfPluginHost is the same for an application without a
// subcommand of its own.
func PluginHostMain(args []string, stdout, stderr io.Writer) int {
	mode := hostModeServe
	for len(args) > 1 {
		switch args[0] {
		case "--probe":
			mode = hostModeProbe
		case "--open":
			mode = hostModeInspect
		default:
			args = nil
			continue
		}
		args = args[1:]
	}
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: plugin-host [--probe [--open]] <plugin file> (started by the xpu loader)")
		return 2
	}
	return hostMain(mode, args[0], stdout, stderr)
}

func hostMain(mode, path string, stdout, stderr io.Writer) int {
	if os.Getenv(handshake.MagicCookieKey) != handshake.MagicCookieValue {
		fmt.Fprintln(stderr, "plugin-host is started by the xpu loader, not by hand")
		return 2
	}
	if path == "" {
		fmt.Fprintln(stderr, "plugin-host: no plugin file given")
		return 2
	}
	watchParent()
	switch mode {
	case hostModeServe:
		if err := ServePluginHost(path); err != nil {
			fmt.Fprintln(stderr, "plugin-host:", err)
			return 1
		}
		return 0
	case hostModeProbe, hostModeInspect:
		ans := probeHere(path, mode == hostModeInspect)
		if err := json.NewEncoder(stdout).Encode(ans); err != nil {
			fmt.Fprintln(stderr, "plugin-host:", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "plugin-host: unknown mode %q\n", mode)
	return 2
}
