package main

import (
	"fmt"
	"io"

	"github.com/xpuhub/xpu/conformance"
)

// runConformCompare is `xpu conform --compare OLD.json NEW.json`: the regressions from one
// report to the next, exit 1 when there is any (2 when a report cannot be read).
func runConformCompare(oldPath, newPath string, stdout, stderr io.Writer) int {
	old, err := conformance.ReadReport(oldPath)
	if err != nil {
		return usageExit(stderr, "xpu conform --compare: %v", err)
	}
	new, err := conformance.ReadReport(newPath)
	if err != nil {
		return usageExit(stderr, "xpu conform --compare: %v", err)
	}
	if old.Backend.Name != new.Backend.Name {
		fmt.Fprintf(stdout, "note: comparing backend %s with backend %s\n", old.Backend.Name, new.Backend.Name)
	}
	regs := conformance.CompareReports(old, new)
	if err := conformance.WriteRegressions(stdout, regs); err != nil {
		return usageExit(stderr, "xpu conform --compare: %v", err)
	}
	if len(regs) > 0 {
		return 1
	}
	return 0
}
