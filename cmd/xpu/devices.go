package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched"
)

func init() {
	register(&command{name: "devices", summary: "list backends and devices (-v: also rejected plugins and why; --units: open those units)", run: runDevices})
}

// deviceRow is one line of `xpu devices` (and one object of --json).
type deviceRow struct {
	Backend      string   `json:"backend"`
	Device       string   `json:"device,omitempty"`
	Unit         string   `json:"unit,omitempty"` // the device's unit name (spec text for --units)
	Index        int      `json:"index"`
	Kind         string   `json:"kind,omitempty"`
	Caps         []string `json:"capabilities,omitempty"`
	MemoryBytes  uint64   `json:"memory_bytes,omitempty"`
	ComputeUnits int      `json:"compute_units,omitempty"`
	Score        int      `json:"score"`
	Reason       string   `json:"reason,omitempty"`
	Path         string   `json:"path,omitempty"`
	Chosen       bool     `json:"chosen"`
	Emulated     bool     `json:"emulated,omitempty"`
}

func runDevices(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("devices", flag.ContinueOnError)
	fs.SetOutput(stderr)
	verbose := fs.Bool("v", false, "also list rejected plugin candidates with their reason")
	asJSON := fs.Bool("json", false, "print JSON")
	units := fs.String("units", "", "open exactly these execution units and list them, e.g. 'neon{cpus=0,threads=1},neon{cpus=1,threads=1},opencl' (exit 1 if one fails)")
	rescan := fs.Bool("rescan", false, "probe every plugin afresh instead of using cached probe results")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *units != "" {
		return runDeviceUnits(ctx, *units, *asJSON, stdout, stderr)
	}
	var lopts []loader.Option
	if *rescan {
		lopts = append(lopts, loader.Rescan())
	}
	cands, err := loader.Discover(ctx, lopts...)
	if err != nil {
		fmt.Fprintln(stderr, "xpu devices:", err)
		return 1
	}
	var rows []deviceRow
	// the built-in backends: the reference first (always usable and the last choice, so the
	// lowest score), then the others by name
	builtIns := core.BuiltIns()
	slices.SortStableFunc(builtIns, func(a, b core.BuiltIn) int {
		return cmp.Compare(boolInt(a.Name != loader.RefName), boolInt(b.Name != loader.RefName))
	})
	for _, b := range builtIns {
		rows = append(rows, builtInRows(ctx, b)...)
	}
	// the chosen plugins are opened in child processes, concurrently: a plugin that crashes or
	// hangs in open is listed with that reason instead of taking this command down
	devs := make([][]core.DeviceInfo, len(cands))
	errs := make([]error, len(cands))
	var wg sync.WaitGroup
	for i, c := range cands {
		if c.Chosen && c.Score > 0 && c.Err == nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				devs[i], errs[i] = loader.Inspect(ctx, c, lopts...)
			}()
		}
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		fmt.Fprintln(stderr, "xpu devices:", err)
		return 1
	}
	for i, c := range cands {
		base := deviceRow{Backend: c.Name, Score: c.Score, Reason: c.Reason, Path: c.Path, Chosen: c.Chosen}
		if c.Err != nil {
			base.Reason = c.Err.Error()
		}
		if base.Backend == "" {
			base.Backend = "?"
		}
		if !c.Chosen || c.Score <= 0 || c.Err != nil {
			if *verbose || (c.Chosen && c.Score <= 0) {
				rows = append(rows, base)
			}
			continue
		}
		if errs[i] != nil {
			base.Reason = errs[i].Error()
			base.Chosen = false
			rows = append(rows, base)
			continue
		}
		for _, info := range devs[i] {
			r := base
			r.Device, r.Unit, r.Index, r.Kind = info.Name, sched.UnitSpec{Backend: info.Backend, Index: info.Index}.String(), info.Index, info.Kind.String()
			r.Caps, r.MemoryBytes, r.ComputeUnits = info.Caps.Names(), info.MemoryBytes, info.ComputeUnits
			r.Emulated = info.Caps.Has(core.CapEmulated)
			rows = append(rows, r)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			fmt.Fprintln(stderr, "xpu devices:", err)
			return 1
		}
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BACKEND\tDEVICE\tUNIT\tKIND\tSCORE\tCAPABILITIES / REASON\tPATH")
	for _, r := range rows {
		id, detail := "-", r.Reason
		if r.Device != "" {
			id = fmt.Sprintf("%d: %s", r.Index, r.Device)
			detail = strings.Join(r.Caps, ",")
		}
		if !r.Chosen && r.Reason != "" {
			detail = "rejected: " + r.Reason
		}
		// a reason may quote a plugin's multi-line output: one row stays one line
		detail = strings.Join(strings.Fields(detail), " ")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Backend, id, dash(r.Unit), dash(r.Kind), r.Score, detail, r.Path)
	}
	tw.Flush()
	return 0
}

// builtInRows lists a built-in backend's devices where its probe says it can run (score > 0),
// else one row with the probe's score 0 and reason (Core ML's emulated runtime still runs by
// name there: --backend coreml, conform --plugin coreml).
func builtInRows(ctx context.Context, b core.BuiltIn) []deviceRow {
	score, reason := 1, ""
	if b.Probe != nil {
		score, reason = b.Probe()
	}
	base := deviceRow{Backend: b.Name, Score: score, Reason: reason, Path: "(built in)", Chosen: true}
	if score <= 0 {
		return []deviceRow{base}
	}
	be, err := b.Open(ctx)
	if err != nil {
		base.Reason, base.Chosen = err.Error(), false
		return []deviceRow{base}
	}
	defer be.Close()
	var rows []deviceRow
	for _, d := range be.Devices() {
		info := d.Info()
		r := base
		r.Device, r.Unit, r.Index, r.Kind = info.Name, sched.UnitName(d), info.Index, info.Kind.String()
		r.Caps, r.Emulated = info.Caps.Names(), info.Caps.Has(core.CapEmulated)
		rows = append(rows, r)
	}
	return rows
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func isUnsupported(err error) bool { return errors.Is(err, core.ErrUnsupported) }
