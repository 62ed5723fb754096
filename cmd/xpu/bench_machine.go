package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/kernelbench"
)

// A tokens/s figure means little without the machine it was measured on: the same build decodes
// at different speeds on an AVX2 laptop and an AVX-512 server, and the bound it is held against is
// the memory's read bandwidth. xpu bench therefore names the CPU, the path the device's kernels
// take (the CPU plugin's device name carries its build and int8 path) and the read bandwidth on
// one and two cores, measured in the same run.

// bandwidthBytes is the buffer the read bandwidth scans: far beyond any last-level cache.
const bandwidthBytes = 256 << 20

// cpuModel is the CPU's model name from /proc/cpuinfo ("model name" on x86, else "Hardware" or
// "CPU part" on arm64), with the number of CPUs; the architecture where there is none.
func cpuModel() string {
	name := ""
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() && name == "" {
			k, v, ok := strings.Cut(sc.Text(), ":")
			switch k = strings.TrimSpace(k); {
			case !ok:
			case k == "model name", k == "Hardware", k == "Processor":
				name = strings.TrimSpace(v)
			}
		}
	}
	if name == "" {
		name = runtime.GOOS + "/" + runtime.GOARCH + " CPU"
	}
	return fmt.Sprintf("%s (%d CPUs)", name, runtime.NumCPU())
}

// machineLine is "CPU; device: its name; read A GB/s (1 core), B GB/s (2 cores); load L", the
// bandwidth measured now unless bandwidth is false, and the 1-minute load average where the
// system gives one (on a shared machine, the other processes' share of the cores).
func machineLine(ctx context.Context, dev core.DeviceInfo, bandwidth bool) (string, error) {
	line := fmt.Sprintf("%s; %s: %s", cpuModel(), dev.ID(), dev.Name)
	if !bandwidth {
		return line, nil
	}
	var parts []string
	for _, n := range []int{1, 2} {
		if n > runtime.NumCPU() {
			break
		}
		bw, err := kernelbench.ReadBandwidth(ctx, n, bandwidthBytes, 100*time.Millisecond)
		if err != nil {
			return "", fmt.Errorf("read bandwidth on %d threads: %w", n, err)
		}
		unit := "cores"
		if n == 1 {
			unit = "core"
		}
		parts = append(parts, fmt.Sprintf("%.1f GB/s (%d %s)", bw/1e9, n, unit))
	}
	line += "; read " + strings.Join(parts, ", ")
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			line += "; load " + f[0]
		}
	}
	return line, nil
}
