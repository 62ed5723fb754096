package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/sched/coresel"
	"github.com/xpuhub/xpu/sched/cputopo"
)

// phaseCores is xpu run's per-phase core selection: --cpus-prefill/--cpus-decode,
// else the selection `xpu tune --energy` stored for this device. Both reach the runner as
// prepare options of the CPU units (llm.WithPhaseOptions), so one context serves both phases.
type phaseCores struct {
	prefill, decode map[string]string
	from            string // where the selection came from, for the stderr line
	stored          bool   // from the tuning cache: said only when the run is on one neon unit
}

// cpuListOptions is the neon cpus=/threads= pair of a --cpus-* flag (nil when not given).
func cpuListOptions(name, list string) (map[string]string, error) {
	if list == "" {
		return nil, nil
	}
	ids, err := cputopo.ParseCPUList(list)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", name, err)
	}
	return map[string]string{"cpus": cputopo.FormatCPUList(ids), "threads": strconv.Itoa(len(ids))}, nil
}

// choosePhaseCores reads the flags (a malformed list is an error) or, when neither is given,
// the run goes to one unit of backend ("" = the policy's pick, which may be neon) and the
// cache is not disabled (--no-aecs), the stored selection. No selection is nil.
// An unreadable cache or topology is a warning on w: the run goes on with the default cores.
func choosePhaseCores(w io.Writer, prefill, decode, backend string, oneUnit, noAECS bool) (*phaseCores, error) {
	p, err := cpuListOptions("cpus-prefill", prefill)
	if err != nil {
		return nil, err
	}
	d, err := cpuListOptions("cpus-decode", decode)
	if err != nil {
		return nil, err
	}
	if p != nil || d != nil {
		return &phaseCores{prefill: p, decode: d, from: "--cpus-prefill/--cpus-decode"}, nil
	}
	if noAECS || !oneUnit || (backend != "" && backend != "neon") {
		return nil, nil
	}
	top, err := cputopo.Read()
	if err != nil {
		fmt.Fprintf(w, "cores: no stored selection used: %v\n", err)
		return nil, nil
	}
	rec, path, err := coresel.LoadMeasured(top, "neon")
	if errors.Is(err, coresel.ErrNoRecord) {
		return nil, nil
	}
	if err == nil {
		p, err = cpuListOptions("cpus-prefill", rec.PrefillCPUs)
	}
	if err == nil {
		d, err = cpuListOptions("cpus-decode", rec.DecodeCPUs)
	}
	if err != nil {
		fmt.Fprintf(w, "cores: stored selection not used: %v\n", err)
		return nil, nil
	}
	return &phaseCores{prefill: p, decode: d, stored: true,
		from: fmt.Sprintf("stored by xpu tune --energy in %s (--no-aecs: not used)", path)}, nil
}

// option is the runner option (nil for no selection).
func (pc *phaseCores) option() []llm.RunnerOption {
	if pc == nil {
		return nil
	}
	return []llm.RunnerOption{llm.WithPhaseOptions(pc.prefill, pc.decode)}
}

// announce says on w which cores each phase runs on, once the runner is open. Flags given for a
// run whose one unit is not a CPU are an error (they would do nothing); a stored selection is
// announced only where it applies, on one neon unit.
func (pc *phaseCores) announce(w io.Writer, r *llm.Runner) error {
	if pc == nil {
		return nil
	}
	info := r.Device().Info()
	if len(r.Units()) == 1 && info.Kind != core.DeviceCPU {
		if pc.stored {
			return nil
		}
		return fmt.Errorf("--cpus-prefill/--cpus-decode pin CPU units; the model runs on %s: %w", info.ID(), core.ErrInvalidArgument)
	}
	if pc.stored && (len(r.Units()) != 1 || info.Backend != "neon") {
		return nil
	}
	say := func(o map[string]string) string {
		if o == nil {
			return "the backend's default"
		}
		return "cpus=" + o["cpus"]
	}
	fmt.Fprintf(w, "cores: prefill %s, decode %s (%s)\n", say(pc.prefill), say(pc.decode), pc.from)
	return nil
}
