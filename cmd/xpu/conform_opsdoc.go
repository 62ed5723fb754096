package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"

	"github.com/xpuhub/xpu/conformance"
	"github.com/xpuhub/xpu/loader"
)

// opsDocBackends are the in-tree backends docs/ops.md covers, in its column order.
var opsDocBackends = []string{"neon", "opencl", "qnn", "coreml", loader.RefName}

// runOpsDoc is `xpu conform --ops-doc FILE`: the op coverage matrix of the named backends (the
// in-tree ones by default) from analyze-only conformance runs of their op cases, written to
// FILE ("-": stdout). Every backend must open: a matrix missing a column would pass for one.
func runOpsDoc(ctx context.Context, path string, names []string, device int, lopts []loader.Option,
	stdout, stderr io.Writer) int {
	if len(names) == 0 {
		names = opsDocBackends
	}
	var reps []*conformance.Report
	for _, name := range names {
		b, err := loader.Open(ctx, name, lopts...)
		if err != nil {
			fmt.Fprintf(stderr, "xpu conform --ops-doc: %s: %v\n", name, err)
			return 1
		}
		rep, err := conformance.Run(ctx, b, conformance.WithDevice(device), conformance.WithLevels(conformance.CoverageLevel),
			conformance.WithAnalyzeOnly())
		if cerr := b.Close(); cerr != nil && err == nil {
			err = cerr
		}
		if err != nil {
			fmt.Fprintf(stderr, "xpu conform --ops-doc: %s: %v\n", name, err)
			return 1
		}
		reps = append(reps, rep)
	}
	var doc bytes.Buffer
	if err := conformance.WriteOpsDoc(&doc, reps); err != nil {
		fmt.Fprintf(stderr, "xpu conform --ops-doc: %v\n", err)
		return 1
	}
	if path == "-" {
		_, err := stdout.Write(doc.Bytes())
		if err != nil {
			return 1
		}
		return 0
	}
	if err := os.WriteFile(path, doc.Bytes(), 0o644); err != nil {
		fmt.Fprintf(stderr, "xpu conform --ops-doc: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s (%d backends)\n", path, len(reps))
	return 0
}
