// Package required reads XPU_REQUIRE_BACKENDS, the backends a run must find: `make test` sets
// it so that a backend that disappears on CI (a plugin not built, an OpenCL ICD that probes 0)
// fails the tests and `xpu conform --all` instead of skipping every check of that backend and
// passing.
package required

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// Env is the variable: backend names separated by commas ("neon,opencl,qnn").
const Env = "XPU_REQUIRE_BACKENDS"

// Names returns the required backend names, none when the variable is unset or empty.
func Names() []string {
	var out []string
	for _, n := range strings.Split(os.Getenv(Env), ",") {
		if n = strings.TrimSpace(n); n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// Is reports whether backend name is required.
func Is(name string) bool { return slices.Contains(Names(), name) }

// Missing returns the required names absent from found, in the variable's order.
func Missing(found []string) []string {
	var out []string
	for _, n := range Names() {
		if !slices.Contains(found, n) {
			out = append(out, n)
		}
	}
	return out
}

// Skip skips tb with the message, or fails it when backend is required: the check the test
// would skip is one CI expects to run.
func Skip(tb testing.TB, backend, format string, args ...any) {
	tb.Helper()
	if Is(backend) {
		tb.Fatalf("%s is required by %s=%s, but: "+format, append([]any{backend, Env, os.Getenv(Env)}, args...)...)
		return // Fatalf does not return; a fake TB's might
	}
	tb.Skipf(format, args...)
}
