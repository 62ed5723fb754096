package main

import (
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/xpuhub/xpu/internal/required"
)

// requireBackends judges what `xpu conform --all` found: none at all is a failure (a run that
// tests nothing must not pass), and so is each backend XPU_REQUIRE_BACKENDS names that is not
// among found (opened) or failed (already reported as failing to open). It prints one FAIL
// line per problem and returns how many there were.
func requireBackends(w io.Writer, found, failed []string) int {
	n := 0
	if len(found) == 0 && len(failed) == 0 {
		fmt.Fprintln(w, "== FAIL [error] --all found no backend that probes above 0 here (xpu devices -v says why)")
		n++
	}
	for _, name := range required.Missing(append(slices.Clone(found), failed...)) {
		fmt.Fprintf(w, "== %s: FAIL [error] required by %s=%s but not found (xpu devices -v says why)\n",
			name, required.Env, os.Getenv(required.Env))
		n++
	}
	return n
}
