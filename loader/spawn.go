package loader

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/core"
)

// How the loader starts plugin-host children, one place for both kinds (the short-lived probe
// child of discovery and the long-lived host of an isolated backend):
//
//   - the child's environment is explicit: ours without the variables that would make it
//     isolate or spawn hosts of its own (go-plugin adds the parent's whole environment unless
//     told not to, which once made a Go app with XPU_ISOLATE=neon fork without end);
//   - the child leads a process group of its own, so that a timeout or Close kills it and
//     everything it started (a plugin may fork helpers), not only the direct child;
//   - the child exits when its parent is gone (watchParent), so that nothing is orphaned.

// envHostMode tells a child started by the loader what to be: hostModeServe (an isolated
// backend's host) or hostModeProbe (probe one plugin file, answer on stdout, exit).
const envHostMode = "XPU_PLUGIN_HOST_MODE"

const (
	hostModeServe = "serve"
	hostModeProbe = "probe"
)

// ErrInPluginHost: a plugin-host process was asked to isolate or probe in a child. A host
// never starts hosts of its own, so that a misconfigured application cannot fork without end.
var ErrInPluginHost = errors.New("this process was started as an xpu plugin host, and a plugin host " +
	"starts no plugin hosts of its own (did main not call loader.ServeIfPluginHost? or point " +
	"loader.WithHostBinary / XPU_PLUGIN_HOST at an xpu binary)")

// inPluginHost is true in a process the loader started as a plugin host (the handshake cookie
// is in its environment), whether or not it got as far as serving.
func inPluginHost() bool {
	return os.Getenv(handshake.MagicCookieKey) != "" || os.Getenv(envHostMode) != ""
}

// refuseInPluginHost fails discovery and opening in a process the loader started as a plugin
// host that did not serve (its main runs instead, because it does not call ServeIfPluginHost):
// going on would run the whole application again in the child, or, isolated, start yet
// another child.
func refuseInPluginHost() error {
	if inPluginHost() {
		return fmt.Errorf("loader: %w: %w", ErrInPluginHost, core.ErrBadState)
	}
	return nil
}

// childEnvDrop are the variables a plugin-host child must not inherit: isolation choices, host
// selection and the markers of a previous generation of hosts (go-plugin's own PLUGIN_*
// handshake variables are set afresh by go-plugin).
var childEnvDrop = []string{EnvIsolate, EnvHostBinary, envChildPlugin, envHostMode,
	handshake.MagicCookieKey, "PLUGIN_MIN_PORT", "PLUGIN_MAX_PORT", "PLUGIN_PROTOCOL_VERSIONS",
	"PLUGIN_CLIENT_CERT", "PLUGIN_MULTIPLEX_GRPC", "PLUGIN_UNIX_SOCKET_DIR"}

// childEnv is the environment of a plugin-host child: ours (a plugin may need PATH,
// LD_LIBRARY_PATH, its SDK's variables, XPU_LOG) less childEnvDrop, plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, d := range childEnvDrop {
			if k == d {
				drop = true
				break
			}
		}
		if !drop {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// hostCommand builds the command of a plugin-host child: bin with args, the explicit
// environment, and a process group of its own.
func hostCommand(bin string, args []string, extraEnv ...string) (*exec.Cmd, error) {
	if inPluginHost() {
		return nil, fmt.Errorf("starting %s %s: %w: %w", bin, strings.Join(args, " "), ErrInPluginHost,
			core.ErrBadState)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = childEnv(extraEnv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, nil
}

// killTree kills the child's whole process group (it leads one: hostCommand), then the child
// itself in case it left the group. Harmless when it is gone already.
func killTree(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	if pid := cmd.Process.Pid; pid > 0 {
		_ = unix.Kill(-pid, unix.SIGKILL)
	}
	_ = cmd.Process.Kill()
}

// watchParent ends this child process when the process that started it is gone (it was
// killed, or exited without closing us): a plugin host must never outlive its parent. Polling
// getppid is portable across unixes and needs no thread-bound death signal (Linux's
// Pdeathsig fires when the forking *thread* exits, which in Go is not the parent's death).
func watchParent() {
	parent := os.Getppid()
	go func() {
		for {
			time.Sleep(200 * time.Millisecond)
			if os.Getppid() != parent {
				fmt.Fprintln(os.Stderr, "xpu plugin-host: the parent process is gone; exiting")
				os.Exit(3)
			}
		}
	}()
}
