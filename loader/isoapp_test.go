package loader

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/internal/modroot"
	"github.com/xpuhub/xpu/loader/plugintest"
)

// processesOf counts the live (not zombie) processes running the executable exe.
func processesOf(t *testing.T, exe string) int {
	t.Helper()
	n, _ := processList(t, exe)
	return n
}

func processList(t *testing.T, exe string) (int, []string) {
	var seen []string
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Skip("no /proc")
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err != nil || target != exe {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if f := strings.Fields(string(st)); len(f) > 2 && f[2] == "Z" {
				continue
			}
		}
		cl, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		seen = append(seen, e.Name()+": "+strings.ReplaceAll(string(cl), "\x00", " "))
		n++
	}
	return n, seen
}

// TestGoAppIsolationDoesNotFork runs the README's kind of Go application with XPU_ISOLATE on:
// it used to start `app plugin-host` children that, inheriting XPU_ISOLATE and running the
// app's main, started children of their own without end. Now the wired app runs isolated with
// one host child, and an app that does not call ServeIfPluginHost fails with a message that
// says so; either way no process outlives the app.
func TestGoAppIsolationDoesNotFork(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Go program: not in -short")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go not on PATH")
	}
	root := modroot.Find()
	require.NotEmpty(t, root)
	plugin := plugintest.Plugin(t)
	app := filepath.Join(t.TempDir(), "isoapp")
	build := exec.Command(goBin, "build", "-o", app, "./loader/testdata/isoapp")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	for _, tc := range []struct {
		name, wire string
		ok         bool
		want       string
	}{
		{"wired", "1", true, "isolated true result [2 0 3 6]"},
		{"not wired", "0", false, "did main not call loader.ServeIfPluginHost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Zero(t, processesOf(t, app))
			cmd := exec.Command(app)
			cmd.Dir = t.TempDir() // no build/plugins here: the test plugin is the only candidate
			cmd.Env = append(os.Environ(), EnvIsolate+"=testplugin", EnvPluginPath+"="+plugin,
				"ISOAPP_BACKEND=testplugin", "ISOAPP_WIRE="+tc.wire, EnvCacheDir+"="+t.TempDir())
			// its own group, so that the test can clean up even after a runaway
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			var most atomic.Int64
			var mostList []string
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { // the number of app processes alive at once, sampled
				defer wg.Done()
				for {
					if n, l := processList(t, app); int64(n) > most.Load() {
						most.Store(int64(n))
						mostList = l
					}
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
				}
			}()
			timer := time.AfterFunc(60*time.Second, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
			out, err := cmd.CombinedOutput()
			timer.Stop()
			close(stop)
			wg.Wait()
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			if tc.ok {
				require.NoError(t, err, "%s", out)
			} else {
				require.Error(t, err, "%s", out)
			}
			assert.Contains(t, string(out), tc.want)
			// the app, its probe child, then its plugin host: never more (it used to be hundreds)
			assert.LessOrEqual(t, most.Load(), int64(3), "app processes alive at once: %q", mostList)
			assert.Zero(t, processesOf(t, app), "a process outlived the app")
		})
	}
}

// TestKillTreeKillsGrandchildren: a timeout or Close kills what the plugin host started too,
// not only the host.
func TestKillTreeKillsGrandchildren(t *testing.T) {
	// a sleep argument nothing else uses (a failed run may have left its own behind)
	marker := fmt.Sprintf("9%d.%d", os.Getpid(), time.Now().UnixNano()%1000000)
	cmd, err := hostCommand("/bin/sh", []string{"-c", "sleep " + marker + " & sleep " + marker + "; wait"})
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	// the shell and its two sleeps
	require.Eventually(t, func() bool { return processesNaming(t, marker) == 3 }, 10*time.Second, 10*time.Millisecond)
	killTree(cmd)
	<-done
	require.Eventually(t, func() bool { return processesNaming(t, marker) == 0 }, 10*time.Second, 10*time.Millisecond,
		"a grandchild survived")
}

// TestIsolatedCloseLeavesNoProcess: Close of an isolated backend ends its plugin host.
func TestIsolatedCloseLeavesNoProcess(t *testing.T) {
	plugin := plugintest.Plugin(t)
	be, err := Open(context.Background(), plugin, Isolated(), WithoutEnv(), WithProbeCacheDir(t.TempDir()))
	require.NoError(t, err)
	st, ok := Stats(be)
	require.True(t, ok)
	require.NotZero(t, st.PID)
	require.NoError(t, be.Close())
	require.Eventually(t, func() bool { return syscall.Kill(st.PID, 0) != nil || isZombie(st.PID) },
		10*time.Second, 10*time.Millisecond, "the plugin host outlived Close")
}

func isZombie(pid int) bool {
	st, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	f := strings.Fields(string(st))
	return len(f) > 2 && f[2] == "Z"
}
