package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/xpuhub/xpu/conformance"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/kernelbench"
)

// perfFlags are `xpu conform --perf`'s settings.
type perfFlags struct {
	threads int
	minTime time.Duration
	harness string
}

// runConformPerf is `xpu conform --perf`: each supported op × shape timed on b, beside the
// device's peaks; the table goes to stdout and <backend>.perf.json to reportDir.
func runConformPerf(ctx context.Context, b core.Backend, device int, filter *regexp.Regexp, pf perfFlags, reportDir string,
	stdout, stderr io.Writer) error {
	o := conformance.PerfOptions{Device: device, Threads: pf.threads, MinTime: pf.minTime, Filter: filter, Progress: stdout}
	// the read bandwidth `xpu bench --kernels` prints, where its harness is built; else (and
	// with --harness "") a Go scan
	if pf.harness != "" {
		h, err := kernelbench.LoadHarness(pf.harness)
		if err != nil {
			fmt.Fprintf(stderr, "xpu conform --perf: no bench harness (%v): the CPU read bandwidth is a Go scan\n", err)
		} else {
			o.ReadBandwidth = func(ctx context.Context, threads int) (float64, error) {
				buf := make([]uint64, 64<<20) // 512 MiB, as xpu bench --kernels
				for i := range buf {
					buf[i] = uint64(i)
				}
				d, err := kernelbench.Time(ctx, func() error { h.Read(buf, threads); return nil }, 3, pf.minTime)
				if err != nil {
					return 0, err
				}
				return float64(8*len(buf)) / d.Seconds(), nil
			}
		}
	}
	rep, err := conformance.RunPerf(ctx, b, o)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if reportDir == "" {
		return nil
	}
	if err := os.MkdirAll(reportDir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(reportDir, (&conformance.Report{Backend: rep.Backend, Device: rep.Device}).FileBase()+".perf.json")
	if err := os.WriteFile(path, append(js, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "== perf report: %s\n", path)
	return nil
}
