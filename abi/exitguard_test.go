package abi

import (
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// envGuardChild makes this test binary, re-executed, install the exit guard and then leave the
// way the value says.
const envGuardChild = "XPU_TEST_EXIT_GUARD_CHILD"

// TestExitGuardChild is the child's body (it does nothing in a normal run).
func TestExitGuardChild(t *testing.T) {
	how := os.Getenv(envGuardChild)
	if how == "" {
		t.Skip("helper of TestExitGuard")
	}
	installExitGuard()
	switch how {
	case "go-exit":
		os.Exit(0) // Go's exit: must not run the guard
	case "return":
		return // back to the test main, which exits 0 (with -race: through the race runtime's finish)
	case "libc-exit", "libc-exit-in-call":
		libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
		require.NoError(t, err)
		sym, err := purego.Dlsym(libc, "exit")
		require.NoError(t, err)
		var exit func(int32)
		purego.RegisterFunc(&exit, sym)
		if how == "libc-exit-in-call" {
			enterCall("fakeplugin", "execution_run")
		}
		exit(0) // what a plugin's exit(0) does
		t.Fatal("exit returned")
	}
}

// TestExitGuard: Go's own ways out never run the guard (so it may treat every run as a plugin's
// exit), and a C exit(0) becomes status 70 with a message naming the call in flight.
func TestExitGuard(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("glibc's exit handlers")
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	for _, tc := range []struct {
		how  string
		code int
		msg  string
	}{
		{"go-exit", 0, ""},
		{"return", 0, ""},
		{"libc-exit", ExitStatusPluginExit, "a plugin called exit(0)"},
		{"libc-exit-in-call", ExitStatusPluginExit, "plugin fakeplugin called exit(0) during execution_run"},
	} {
		t.Run(tc.how, func(t *testing.T) {
			cmd := exec.Command(exe, "-test.run=^TestExitGuardChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), envGuardChild+"="+tc.how)
			out, _ := cmd.CombinedOutput()
			assert.Equal(t, tc.code, cmd.ProcessState.ExitCode(), "%s", out)
			if tc.msg == "" {
				assert.NotContains(t, string(out), "called exit", "the guard ran on Go's own exit")
			} else {
				assert.Contains(t, string(out), tc.msg)
			}
		})
	}
}
