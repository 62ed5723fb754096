package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// An in-process conformance run loads plugins into the process that prints the verdict, so a
// plugin that calls _exit(0) (or exit_group, which no exit guard can catch) would end the run
// with status 0 and no summary, and a plugin hung inside a C call cannot be interrupted. So
// `xpu conform` without --isolated runs itself as a child and judges by the child's summary:
// the child writes a sentinel ("summary <status>") on an inherited pipe right after its
// summary line; a child that ends without one failed, whatever its exit status.

// envConformChild marks the child of a supervised run; its value is the sentinel's fd.
const envConformChild = "XPU_CONFORM_CHILD"

// interruptGrace is how long a child may take to stop after SIGINT (it stops between cases)
// before it is killed (it is stuck in a plugin's call).
const interruptGrace = 3 * time.Second

// exitInterrupted is the status of a run stopped by SIGINT (128 + 2, as shells report it).
const exitInterrupted = 130

// conformChildSentinel returns the pipe to write the sentinel to when this process is a
// supervised run's child, else nil. The fd is made close-on-exec so that the plugin-host and
// probe children this run starts do not hold the pipe open.
func conformChildSentinel() *os.File {
	v := os.Getenv(envConformChild)
	if v == "" {
		return nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil
	}
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "conform-sentinel")
}

// writeSentinel tells the supervising parent that the summary was printed, and with which
// status the run ends.
func writeSentinel(f *os.File, code int) {
	if f == nil {
		return
	}
	fmt.Fprintf(f, "summary %d\n", code)
	f.Close()
}

// superviseConform runs `xpu conform args...` as a child of this process and returns the
// status the run deserves: the child's when it printed its summary, 1 when it did not, and
// exitInterrupted when SIGINT (ctx) stopped it.
func superviseConform(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "xpu conform: cannot find this executable to run the suite in a child: %v\n", err)
		return 1
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		fmt.Fprintf(stderr, "xpu conform: %v\n", err)
		return 1
	}
	defer pr.Close()
	cmd := exec.Command(exe, append([]string{"conform"}, args...)...)
	cmd.Env = append(os.Environ(), envConformChild+"=3", envCLIChild+"=1") // ExtraFiles[0] is fd 3
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.ExtraFiles = []*os.File{pw}
	cmd.WaitDelay = time.Second // a process the plugin left behind must not hold the pipes
	if err := cmd.Start(); err != nil {
		pw.Close()
		fmt.Fprintf(stderr, "xpu conform: starting the suite's child: %v\n", err)
		return 1
	}
	pw.Close()
	sentinel := make(chan string, 1)
	go func() {
		// one line, not to EOF: a process the child started before it marked the pipe
		// close-on-exec (the crash monitor) may hold the write end open after the child is gone
		b, _ := bufio.NewReader(io.LimitReader(pr, 64)).ReadString('\n')
		sentinel <- strings.TrimSpace(b)
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	var werr error
	interrupted, killed := false, false
	select {
	case werr = <-done:
	case <-ctx.Done():
		// a terminal's Ctrl-C reaches the child too; a SIGINT sent to this process alone must
		interrupted = true
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case werr = <-done:
		case <-time.After(interruptGrace):
			_ = cmd.Process.Kill()
			killed = true
			werr = <-done
		}
	}
	status := 0
	var ee *exec.ExitError
	switch {
	case errors.As(werr, &ee):
		status = ee.ExitCode() // -1 when a signal killed it
	case werr != nil && !errors.Is(werr, exec.ErrWaitDelay):
		fmt.Fprintf(stderr, "xpu conform: waiting for the suite's child: %v\n", werr)
		status = 1
	}
	var got string
	select {
	case got = <-sentinel:
	case <-time.After(time.Second): // the pipe is closed when the child is gone; be safe
	}
	summarized := strings.HasPrefix(got, "summary ")
	want, _ := strconv.Atoi(strings.TrimPrefix(got, "summary "))
	switch {
	case interrupted:
		how := "stopped"
		if killed {
			how = fmt.Sprintf("killed after %v (a plugin call did not return)", interruptGrace)
		}
		fmt.Fprintf(stdout, "interrupted: the run was %s before its last case; its counts are partial\n", how)
		return exitInterrupted
	case !summarized:
		if status <= 0 {
			status = 1
		}
		how := "exited with status 0"
		if ee != nil {
			how = fmt.Sprintf("exited with status %d", ee.ExitCode())
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				how = "was killed by " + ws.Signal().String()
			}
		}
		fmt.Fprintf(stdout, "FAIL: the conformance run %s before its summary: a plugin ended the process "+
			"(exit, _exit) or crashed it; rerun with --isolated to find the case\n", how)
		return status
	case status != want:
		fmt.Fprintf(stdout, "FAIL: the conformance run printed its summary, then exited with status %d\n", status)
		return max(status, 1)
	}
	return status
}
