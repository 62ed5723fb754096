package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/xpuhub/xpu/conformance"
)

// envCLIChild marks a process that xpu started as itself (a supervised conform run, the
// level-1 run of an isolated one): test binaries serve as the CLI when they see it.
const envCLIChild = "XPU_CLI_CHILD"

// abiChildRunner runs the level-1 (raw ABI) cases of an isolated plugin in a child `xpu conform`
// that loads the plugin file in process, as the suite does without --isolated: both modes then
// run the same levels (stale handles, buffer_alloc, shutdown leaks). filter is the run's own
// (nil: every ABI case). The child's report gives the results; a child that failed beyond its
// cases (a backend that cannot shut down) adds one more failing case saying so.
func abiChildRunner(path string, device int, seed uint64, filter string) func(ctx context.Context) ([]conformance.CaseResult, error) {
	return func(ctx context.Context) ([]conformance.CaseResult, error) {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("cannot find this executable: %w", err)
		}
		dir, err := os.MkdirTemp("", "xpu-conform-abi-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		if filter == "" {
			filter = `^ABI\(`
		}
		cmd := exec.CommandContext(ctx, exe, "conform", "--plugin", path, "--device", strconv.Itoa(device),
			"--seed", strconv.FormatUint(seed, 10), "--filter", filter, "--report", dir)
		cmd.Env = append(os.Environ(), envCLIChild+"=1")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		runErr := cmd.Run()
		files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		if len(files) != 1 {
			return nil, fmt.Errorf("`xpu conform --plugin %s --filter '%s'` in process wrote no report (%v); its last output: %s",
				path, filter, runErr, lastLines(out.String(), 5))
		}
		b, err := os.ReadFile(files[0])
		if err != nil {
			return nil, err
		}
		var rep conformance.Report
		if err := json.Unmarshal(b, &rep); err != nil {
			return nil, fmt.Errorf("reading the level-1 run's report: %w", err)
		}
		if runErr != nil && rep.Failed == 0 {
			// the cases passed, the run did not: its end (closing the backend, shutdown) failed
			res := conformance.CaseResult{Name: "ABI(in-process-shutdown)", Level: 1, Op: "ABI",
				DType: "in-process-shutdown", Status: conformance.StatusFail, Category: conformance.CatError,
				Errors: []string{fmt.Sprintf("the in-process run of level 1 ended with %v: %s", runErr, failLines(out.String()))},
				Repro:  fmt.Sprintf("xpu conform --plugin %s --filter '%s' --seed %d", path, filter, seed)}
			rep.Cases = append(rep.Cases, res)
		}
		return rep.Cases, nil
	}
}

// lastLines is the last n lines of s, on one line.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// failLines are the "== ...: FAIL" lines of a conform run's output (or its tail without any).
func failLines(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "== ") && strings.Contains(l, "FAIL") {
			out = append(out, strings.TrimPrefix(l, "== "))
		}
	}
	if len(out) == 0 {
		return lastLines(s, 3)
	}
	return strings.Join(out, "; ")
}
