package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched/coresel"
	"github.com/xpuhub/xpu/sched/cputopo"
	"github.com/xpuhub/xpu/sched/energy"
)

func init() {
	register(&command{name: "tune", summary: "--energy: energy-aware CPU core selection (MNN-AECS); --profile: per-unit op latency profile for the solver", run: runTune})
}

// tuneFlags are xpu tune's settings.
type tuneFlags struct {
	model, simulate, backend, root string
	soc                            string
	tokens, warmup, compare        int
	epsilon, alpha                 float64
	seed                           uint64
	noCache                        bool
	coolWait                       time.Duration
}

func runTune(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f tuneFlags
	energyMode := fs.Bool("energy", false, "tune the decode core selection for energy")
	profileMode := fs.Bool("profile", false, "measure each unit's op latencies over the model's shapes and store the profile `xpu plan` reads")
	units := fs.String("units", defaultProfileUnits, "--profile: the units to measure (unit specs, see xpu devices --units)")
	grid := fs.String("grid", "1,4,16,64,256,1024", "--profile: the row counts (chunk lengths) to time")
	out := fs.String("o", "", "--profile: also write the profile to this file")
	minTime := fs.Duration("min-time", 20*time.Millisecond, "--profile: time spent on each point (at least 3 runs, the median)")
	fs.StringVar(&f.model, "model", "", "GGUF model the trials decode (with --simulate: optional, sets the workload's bytes per token)")
	fs.StringVar(&f.simulate, "simulate", "", "run the search against an SoC description instead of real trials: "+strings.Join(coresel.SoCNames(), ", "))
	fs.IntVar(&f.tokens, "tokens", 50, "decode tokens per trial (the paper: 50)")
	fs.IntVar(&f.warmup, "warmup", 5, "decode tokens before each trial's window")
	fs.IntVar(&f.compare, "compare", 3, "after tuning, rounds of interleaved trials of the choice vs all cores (0: none; real mode)")
	fs.Float64Var(&f.epsilon, "epsilon", 0.08, "allowed decode slowdown vs the fastest selection")
	fs.Float64Var(&f.alpha, "alpha", 0.5, "weight of the power heuristic in E_h (0: measured energy only)")
	fs.Uint64Var(&f.seed, "seed", 1, "noise seed of the simulation")
	fs.StringVar(&f.backend, "backend", "neon", "CPU backend of the real trials")
	fs.StringVar(&f.soc, "soc", "", "real trials: the SoC description whose power model stands in where no energy meter can be read (default: a CPU-time model)")
	fs.StringVar(&f.root, "root", "/", "read sysfs/procfs under this root (fake trees in tests)")
	fs.BoolVar(&f.noCache, "no-cache", false, "do not store the result")
	fs.DurationVar(&f.coolWait, "cool-wait", time.Minute, "how long to wait for the thermal gate (below 40 °C) before giving up")
	setUsage(fs, stderr,
		"usage: xpu tune --energy --model M [--simulate "+strings.Join(coresel.SoCNames(), "|")+"] [--tokens N] [--warmup N] [--compare R] [--epsilon E] [--alpha A]",
		"       xpu tune --profile --model M [--units LIST] [--grid 1,4,...] [-o FILE] [--no-cache]",
	)
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *profileMode {
		if *energyMode || fs.NArg() > 0 || f.model == "" {
			fs.Usage()
			return 2
		}
		if err := tuneProfile(ctx, f.model, *units, *grid, *out, *minTime, f.noCache, stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "xpu tune: %v\n", err)
			return 1
		}
		return 0
	}
	if !*energyMode || fs.NArg() > 0 || (f.model == "" && f.simulate == "") || f.tokens < 1 || f.warmup < 0 || f.compare < 0 {
		fs.Usage()
		return 2
	}
	var err error
	if f.simulate != "" {
		err = tuneSimulated(ctx, f, stdout, stderr)
	} else {
		err = tuneMeasured(ctx, f, stdout, stderr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "xpu tune: %v\n", err)
		return 1
	}
	return 0
}

// progress prints each trial as it ends.
func progress(w io.Writer, top *cputopo.Topology, unit string) func(coresel.Event) {
	return func(e coresel.Event) {
		reused := ""
		if e.Reused {
			reused = " (measured in stage 1)"
		}
		cpus, _ := e.Selection.CPUs(top)
		extra := ""
		if e.M.CPUSecPerToken > 0 {
			extra = fmt.Sprintf("  %.4f CPU-s/token", e.M.CPUSecPerToken)
		}
		fmt.Fprintf(w, "  [%s #%d] %-9s cpus=%-15s %7.2f tok/s  %8.1f m%s/token%s  %s%s\n", e.Stage, e.Index, e.Selection.Key(),
			cputopo.FormatCPUList(cpus), e.M.TokPerSec, e.M.JoulesPerToken*1e3, unit, extra, e.Words, reused)
	}
}

func printTree(w io.Writer, res *coresel.Result, unit string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  node\tfrom\ttok/s\tm%s/token\tE_h\tε filter\tselection\n", unit)
	for _, n := range res.Tree {
		from := "root Ĩ"
		if n.Level > 0 {
			from = fmt.Sprintf("L%d %s) of %s", n.Level, n.Transform, n.Parent)
		}
		kept := "kept"
		if !n.Kept {
			kept = "too slow"
		}
		mark := ""
		if n.Key == res.Best.Key {
			mark = "  ← chosen"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%.2f\t%.1f\t%.1f\t%s\t%s%s\n", n.Key, from, n.M.TokPerSec, n.M.JoulesPerToken*1e3, n.EH*1e3, kept, n.Words, mark)
	}
	tw.Flush()
}

func store(stderr io.Writer, f tuneFlags, rec coresel.Record) {
	if f.noCache {
		return
	}
	dir, err := coresel.CacheDir()
	if err == nil {
		var path string
		if path, err = coresel.Save(dir, rec); err == nil {
			fmt.Fprintf(stderr, "stored: %s\n", path)
			return
		}
	}
	fmt.Fprintf(stderr, "xpu tune: result not stored: %v\n", err)
}

// tuneSimulated runs the search on an SoC description: every figure is a prediction.
func tuneSimulated(ctx context.Context, f tuneFlags, stdout, stderr io.Writer) error {
	soc, err := coresel.LoadSoC(f.simulate)
	if err != nil {
		return err
	}
	if f.model != "" {
		// the workload of decoding this model: its weights read once per token, the
		// description's operations per byte
		m, err := llm.Open(f.model)
		if err != nil {
			return err
		}
		gb := float64(m.WeightBytes()) / 1e9
		_ = m.Close()
		soc.Model = coresel.Workload{Name: f.model, GBPerToken: gb, GopsPerToken: gb * soc.Model.GopsPerToken / soc.Model.GBPerToken}
	}
	tr, err := coresel.NewSimTrial(soc, f.seed, f.tokens)
	if err != nil {
		return err
	}
	top := tr.Top
	fmt.Fprintf(stdout, "SIMULATION of %s: every figure below is PREDICTED by the SoC description's model (sched/soc/socs/%s.json), not measured\n", soc.Device, soc.Name)
	fmt.Fprintf(stdout, "topology: %s (governor %s, idle clusters lowered: %v)\n", top, soc.Governor, soc.IdleScaling)
	fmt.Fprintf(stdout, "workload: %s, %.2f GB and %.1f Gop per token; meter: %s; exhaustive space %d selections\n",
		soc.Model.Name, soc.Model.GBPerToken, soc.Model.GopsPerToken, tr.Meter(), top.SpaceSize())
	fmt.Fprintln(stdout, "search:")
	res, err := coresel.Tune(ctx, top, tr, coresel.WithEpsilon(f.epsilon), coresel.WithAlpha(f.alpha),
		coresel.WithFlatGovernor(!soc.IdleScaling), coresel.WithProgress(progress(stdout, top, "J")))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "stage 1 (fastest): %s; stage 2: %d candidates, %d trials in all\n", res.Fastest.Describe(top), len(res.Tree), res.Trials)
	printTree(stdout, res, "J")
	fmt.Fprintf(stdout, "prefill: %s\ndecode:  %s   (paper, Table 7: %s)\n", res.Prefill.Describe(top), res.Decode.Describe(top), soc.Paper.Words)

	// noiseless predictions for the comparison
	predict := func(s cputopo.Selection) (float64, float64) {
		tps, w, _ := soc.Predict(top, s)
		return tps, w / tps
	}
	tc, jc := predict(res.Decode)
	ta, ja := predict(top.Counts())
	mnn := mnnDefault(top)
	tm, jm := predict(mnn)
	fmt.Fprintf(stdout, "PREDICTED decode: chosen %.1f tok/s %.0f mJ/token; all %d cores %.1f tok/s %.0f mJ/token (energy %+.0f %%, speed %+.0f %%); "+
		"4 biggest cores (%s, MNN's default) %.1f tok/s %.0f mJ/token (energy %+.0f %%, speed %+.0f %%)\n",
		tc, jc*1e3, top.Counts().Cores(), ta, ja*1e3, (jc/ja-1)*100, (tc/ta-1)*100, mnn.Key(), tm, jm*1e3, (jc/jm-1)*100, (tc/tm-1)*100)
	fmt.Fprintf(stdout, "paper: energy %+.0f %% vs MNN (%s), speed %+.0f %%\n", -soc.Paper.SavingVsMNN*100, soc.Paper.SavingSource, soc.Paper.SpeedVsMNN*100)
	rec, err := coresel.NewRecord(top, res, coresel.Fingerprint(top, "sim:"+soc.Name), "simulated:"+soc.Name, tr.Meter(), soc.Model.Name, f.tokens)
	if err != nil {
		return err
	}
	store(stderr, f, rec)
	return nil
}

// mnnDefault is stock MNN's decode configuration: 4 threads on the biggest cores.
func mnnDefault(top *cputopo.Topology) cputopo.Selection {
	s := make(cputopo.Selection, len(top.Clusters))
	left := 4
	for i, c := range top.Clusters {
		s[i] = min(left, c.Size())
		left -= s[i]
	}
	return s
}

// maxStretch bounds how many times the asked tokens a trial decodes to fill the meter's
// minimum window.
const maxStretch = 8

// decodeTrial decodes with one runner per selection, its context pinned to the selection.
type decodeTrial struct {
	m              *llm.Model
	dev            core.Device
	top            *cputopo.Topology
	meterFor       func(cputopo.Selection) (energy.Meter, error)
	gate           func(context.Context) error // measurement conditions, before each trial
	tokens, warmup int
	prepare        []time.Duration // runner set-up time per trial
}

// Measure implements coresel.Trial: a short prompt, warm-up tokens, then tokens decode steps
// (greedy; more while the window is shorter than the meter's minimum) inside the meter's
// window, with the process CPU time around them.
func (d *decodeTrial) Measure(ctx context.Context, sel cputopo.Selection) (coresel.Measurement, error) {
	opts, err := cputopo.NeonOptions(d.top, sel)
	if err != nil {
		return coresel.Measurement{}, err
	}
	meter, err := d.meterFor(sel)
	if err != nil {
		return coresel.Measurement{}, err
	}
	if d.gate != nil {
		if err := d.gate(ctx); err != nil {
			return coresel.Measurement{}, err
		}
	}
	prompt := []int32{}
	for i := range 8 {
		prompt = append(prompt, int32(1+i)%int32(d.m.Config.Vocab))
	}
	most := min(d.tokens*maxStretch, max(d.tokens, 4096)) // decode steps the window may stretch to
	t0 := time.Now()
	r, err := llm.NewRunner(ctx, d.m, d.dev, llm.WithContextOptions(opts),
		llm.WithContextLength(len(prompt)+d.warmup+most+1), llm.WithChunkSize(len(prompt)))
	if err != nil {
		return coresel.Measurement{}, err
	}
	defer r.Close()
	d.prepare = append(d.prepare, time.Since(t0))
	logits, err := r.Prefill(ctx, prompt)
	if err != nil {
		return coresel.Measurement{}, err
	}
	step := func() error {
		logits, err = r.Decode(ctx, argmax(logits))
		return err
	}
	for range d.warmup {
		if err := step(); err != nil {
			return coresel.Measurement{}, err
		}
	}
	c0, err := energy.ProcessCPUTime()
	if err != nil {
		return coresel.Measurement{}, err
	}
	if err := meter.Start(ctx); err != nil {
		return coresel.Measurement{}, err
	}
	w0 := time.Now()
	// at least the asked tokens, and more (up to maxStretch times as many) while the window is
	// shorter than the meter can resolve: a fast model must not make the reading unreliable
	n := 0
	for ; n < d.tokens || (time.Since(w0) < meter.MinWindow() && n < most); n++ {
		if err := step(); err != nil {
			_, _ = meter.Stop()
			return coresel.Measurement{}, err
		}
	}
	wall := time.Since(w0)
	rd, merr := meter.Stop()
	c1, err := energy.ProcessCPUTime()
	if err != nil {
		return coresel.Measurement{}, err
	}
	if merr != nil {
		return coresel.Measurement{}, fmt.Errorf("meter %s: %w (a trial of %d tokens took %v; try more --tokens)", meter.Name(), merr, n, wall)
	}
	fn := float64(n)
	return coresel.Measurement{TokPerSec: fn / wall.Seconds(), JoulesPerToken: rd.Joules / fn, Modelled: rd.Modelled,
		Meter: rd.Meter, CPUSecPerToken: (c1 - c0).Seconds() / fn, Tokens: n, Note: rd.Note}, nil
}

// argmax is greedy decoding as llama.cpp's logits.c does it: the highest logit, the lowest id on
// a tie.
func argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

// tuneMeasured runs real trials on this machine's CPUs.
func tuneMeasured(ctx context.Context, f tuneFlags, stdout, stderr io.Writer) error {
	top, err := cputopo.Read(cputopo.WithRoot(f.root))
	if err != nil {
		return err
	}
	cond, err := energy.WaitCool(ctx, energy.DefaultLimits, f.coolWait, time.Second, energy.WithRoot(f.root))
	fmt.Fprintf(stdout, "gates: %s\n", cond.Describe())
	if err != nil {
		return err
	}
	// The meter: a battery or RAPL where one can be read, with a model answering (announced)
	// when its reading is nonsense; the model alone where there is none. The model is the
	// --soc description's power for the selection on trial, or CPU time.
	cpuModel := energy.NewCPUTimeModel(0.5, 2)
	var soc *coresel.SoC
	if f.soc != "" {
		if soc, err = coresel.LoadSoC(f.soc); err != nil {
			return err
		}
		if _, err := soc.PowerMeter(top, top.Counts()); err != nil {
			return fmt.Errorf("--soc %s does not describe this machine: %w", f.soc, err)
		}
	}
	modelFor := func(sel cputopo.Selection) (energy.Meter, error) {
		if soc != nil {
			return soc.PowerMeter(top, sel)
		}
		return cpuModel, nil
	}
	modelName := cpuModel.Name()
	if soc != nil {
		modelName = "model:soc " + soc.Name + " (its power for each selection)"
	}
	announce := func(s string) { fmt.Fprintf(stderr, "meter fallback: %s\n", s) }
	real, rerr := energy.Open(energy.WithRoot(f.root))
	meterFor := func(sel cputopo.Selection) (energy.Meter, error) {
		m, err := modelFor(sel)
		if err != nil || rerr != nil {
			return m, err
		}
		return energy.NewFallback(real, m, announce), nil
	}
	modelled := rerr != nil
	if modelled {
		fmt.Fprintf(stdout, "no energy meter here (%s): energy figures are MODELLED by %s; CPU-seconds per token (getrusage) are measured\n",
			strings.ReplaceAll(rerr.Error(), "\n", "; "), modelName)
		fmt.Fprintf(stdout, "meter: %s\n", modelName)
	} else {
		fmt.Fprintf(stdout, "meter: %s (sample interval %v, minimum window %v; fallback, announced: %s)\n",
			real.Name(), real.SampleInterval(), real.MinWindow(), modelName)
	}
	b, err := loader.Open(ctx, f.backend)
	if err != nil {
		return err
	}
	defer b.Close()
	if len(b.Devices()) == 0 || b.Devices()[0].Info().Kind != core.DeviceCPU {
		return fmt.Errorf("backend %s has no CPU device: %w", f.backend, core.ErrInvalidArgument)
	}
	m, err := llm.Open(f.model)
	if err != nil {
		return err
	}
	defer m.Close()
	tr := &decodeTrial{m: m, dev: b.Devices()[0], top: top, meterFor: meterFor, tokens: f.tokens, warmup: f.warmup,
		gate: func(ctx context.Context) error {
			_, err := energy.WaitCool(ctx, energy.DefaultLimits, f.coolWait, time.Second, energy.WithRoot(f.root))
			return err
		}}
	cpufreq := "cpufreq clusters"
	if !top.HasCPUFreq {
		cpufreq = "no cpufreq: one cluster per cpu_capacity, every k-core selection equivalent"
	}
	fmt.Fprintf(stdout, "topology: %s (%s); exhaustive space %d selections\n", top, cpufreq, top.SpaceSize())
	fmt.Fprintf(stdout, "model: %s (%.0f MB of weights); %d warm-up + %d decode tokens per trial, one runner per trial\n",
		f.model, float64(m.WeightBytes())/1e6, f.warmup, f.tokens)
	unit := "J"
	if modelled {
		unit = "J(modelled)"
	}
	fmt.Fprintln(stdout, "search:")
	t0 := time.Now()
	res, err := coresel.Tune(ctx, top, tr, coresel.WithEpsilon(f.epsilon), coresel.WithAlpha(f.alpha), coresel.WithProgress(progress(stdout, top, unit)))
	if err != nil {
		return err
	}
	took := time.Since(t0)
	fmt.Fprintf(stdout, "stage 1 (fastest): %s; stage 2: %d candidates, %d trials in %.1f s (runner set-up %s per trial)\n",
		res.Fastest.Describe(top), len(res.Tree), res.Trials, took.Seconds(), medianDur(tr.prepare))
	printTree(stdout, res, unit)
	po, err := cputopo.NeonPhaseOptions(top, res.Prefill, res.Decode)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "prefill: %s (cpus=%s)\ndecode:  %s (cpus=%s)\n", res.Prefill.Describe(top), po.Prefill["cpus"], res.Decode.Describe(top), po.Decode["cpus"])
	if f.compare > 0 {
		if err := compareAll(ctx, stdout, tr, top, res.Decode, f.compare, modelled); err != nil {
			return err
		}
	}
	meterName := modelName
	if !modelled {
		meterName = real.Name()
	}
	rec, err := coresel.NewRecord(top, res, coresel.MeasuredFingerprint(top, f.backend), "measured", meterName, f.model, f.tokens)
	if err != nil {
		return err
	}
	store(stderr, f, rec)
	return nil
}

// compareAll runs rounds of interleaved trials of the chosen selection and of every core, and
// prints the median ratios.
func compareAll(ctx context.Context, w io.Writer, tr *decodeTrial, top *cputopo.Topology, chosen cputopo.Selection, rounds int, modelled bool) error {
	all := top.Counts()
	var rt, rc, re []float64
	for i := range rounds {
		a, err := tr.Measure(ctx, chosen)
		if err != nil {
			return err
		}
		b, err := tr.Measure(ctx, all)
		if err != nil {
			return err
		}
		rt = append(rt, a.TokPerSec/b.TokPerSec)
		rc = append(rc, a.CPUSecPerToken/b.CPUSecPerToken)
		re = append(re, a.JoulesPerToken/b.JoulesPerToken)
		fmt.Fprintf(w, "  compare round %d: chosen %s %.2f tok/s %.4f CPU-s/token; all cores %s %.2f tok/s %.4f CPU-s/token\n",
			i+1, chosen.Key(), a.TokPerSec, a.CPUSecPerToken, all.Key(), b.TokPerSec, b.CPUSecPerToken)
	}
	kind := "measured"
	if modelled {
		kind = "MODELLED"
	}
	fmt.Fprintf(w, "MEASURED chosen/all-cores (median of %d interleaved rounds): tok/s ×%.3f, CPU-seconds per token ×%.3f; energy (%s) ×%.3f\n",
		rounds, median(rt), median(rc), kind, median(re))
	return nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianDur(v []time.Duration) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}
