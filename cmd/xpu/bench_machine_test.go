package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBenchNamesTheMachine: xpu bench prints, once per run, the CPU, the device's own name (for
// the CPU plugin: its build and int8 path) and the read bandwidth on 1 and 2 cores measured in
// the same run, so that no figure is read as another machine's.
func TestBenchNamesTheMachine(t *testing.T) {
	p := storiesPath(t)
	base := []string{"bench", "-m", p, "-p", "0", "-n", "2", "-r", "1", "-t", "1,2", "--backend", "ref", "--no-warmup"}
	tests := []struct {
		name  string
		extra []string
		want  string
		not   string
	}{
		{name: "with the bandwidth", want: `xpu bench: machine: .+ \(\d+ CPUs\); ref:0: [^;]+; read [0-9.]+ GB/s \(1 core\)(, [0-9.]+ GB/s \(2 cores\))?(; load [0-9.]+)?\n`},
		{name: "without", extra: []string{"--bandwidth=false"}, want: `xpu bench: machine: .+ \(\d+ CPUs\); ref:0: [^;\n]+\n`, not: "GB/s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runCLI(t, append(base, tc.extra...)...)
			require.Equal(t, 0, code, errOut)
			assert.Regexp(t, tc.want, errOut)
			assert.Equal(t, 1, strings.Count(errOut, "xpu bench: machine:"), "once per run, not per configuration")
			if tc.not != "" {
				assert.NotContains(t, errOut, tc.not)
			}
		})
	}
}
