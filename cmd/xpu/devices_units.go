package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched"
)

// unitRow is one line of `xpu devices --units` (and one object of --json).
type unitRow struct {
	Unit    string            `json:"unit"`
	Device  string            `json:"device,omitempty"`
	Kind    string            `json:"kind,omitempty"`
	Options map[string]string `json:"options,omitempty"`
	OK      bool              `json:"ok"`
	Error   string            `json:"error,omitempty"`
}

// runDeviceUnits opens exactly the units of list (unit specs, see sched.ParseUnitList), each in
// a context of its own as the scheduler would, and lists them. A unit that fails to open is
// listed with the reason and makes the exit status 1; a list that does not parse is a usage
// error (2).
func runDeviceUnits(ctx context.Context, list string, asJSON bool, stdout, stderr io.Writer) int {
	specs, err := sched.ParseUnitList(list)
	if err != nil {
		fmt.Fprintln(stderr, "xpu devices:", err)
		return 2
	}
	backends := map[string]core.Backend{}
	backendErr := map[string]error{}
	var units []*sched.Unit
	defer func() {
		// units first: each holds a context of its backend
		for _, u := range slices.Backward(units) {
			if err := u.Close(); err != nil {
				fmt.Fprintf(stderr, "xpu devices: close unit %s: %v\n", u.Name(), err)
			}
		}
		for _, b := range backends {
			b.Close()
		}
	}()
	rows := make([]unitRow, 0, len(specs))
	failed := false
	for _, spec := range specs {
		row := unitRow{Unit: spec.String(), Options: maps.Clone(spec.Options)}
		u, dev, err := openUnit(ctx, spec, backends, backendErr)
		if dev != nil {
			info := dev.Info()
			row.Device, row.Kind = info.Name, info.Kind.String()
		}
		if err != nil {
			row.Error, failed = err.Error(), true
		} else {
			row.OK = true
			units = append(units, u)
		}
		rows = append(rows, row)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			fmt.Fprintln(stderr, "xpu devices:", err)
			return 1
		}
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "UNIT\tDEVICE\tKIND\tSTATUS")
		for _, r := range rows {
			status := "open"
			if !r.OK {
				status = "failed: " + r.Error
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Unit, dash(r.Device), dash(r.Kind), status)
		}
		tw.Flush()
	}
	if failed {
		return 1
	}
	return 0
}

// openUnit opens one unit, loading its backend once (a backend that fails to load fails every
// unit on it with the same reason).
func openUnit(ctx context.Context, spec sched.UnitSpec, backends map[string]core.Backend,
	backendErr map[string]error) (*sched.Unit, core.Device, error) {
	b, ok := backends[spec.Backend]
	if !ok {
		if err := backendErr[spec.Backend]; err != nil {
			return nil, nil, err
		}
		var err error
		if b, err = loader.Open(ctx, spec.Backend); err != nil {
			if errors.Is(err, core.ErrNotFound) {
				err = fmt.Errorf("%w (xpu devices lists the backends there are)", err)
			}
			backendErr[spec.Backend] = err
			return nil, nil, err
		}
		backends[spec.Backend] = b
	}
	dev, err := sched.FindDevice(spec, b.Devices())
	if err != nil {
		return nil, nil, err
	}
	u, err := sched.OpenUnit(ctx, dev, spec)
	if err != nil {
		return nil, dev, err
	}
	return u, dev, nil
}
