package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/xpuhub/xpu/internal/safefile"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/sched/dag"
	"github.com/xpuhub/xpu/sched/profile"
	"github.com/xpuhub/xpu/sched/soc"
	"github.com/xpuhub/xpu/sched/solve"
)

func init() {
	register(&command{name: "plan", summary: "solve a placement plan from a profile (xpu tune --profile) or an SoC description (--soc), print it and its predicted speed", run: runPlan})
}

func runPlan(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	model := fs.String("model", "", "GGUF model (measured profile), or with --soc a shipped config ("+strings.Join(soc.ModelNames(), ", ")+") or a GGUF file for its shapes")
	units := fs.String("units", "", "units to plan over (default: every unit of the profile; measured: "+defaultProfileUnits+")")
	socName := fs.String("soc", "", "plan for a simulated SoC description instead of this machine: "+strings.Join(soc.PlanNames(), ", "))
	profFile := fs.String("profile", "", "read the profile from this file instead of the cache")
	out := fs.String("o", "", "write the plan file (sched/PLAN.md format) here")
	prompt := fs.Int("prompt", 1024, "prompt length prefill is predicted for")
	ctxLen := fs.Int("context", 0, "KV length decode is predicted at (0: the prompt length)")
	mode := fs.String("mode", "tensor", "what the solver may choose: tensor (split MATMULs), layer (whole ops), split (contiguous layer ranges only), single (one unit)")
	policy := fs.String("policy", "ooo", "prefill dispatch: ooo (mllm-NPU out-of-order), fifo, inorder")
	steal := fs.Bool("steal", false, "write rows splits over two units as stealing ones (sched/PLAN.md): balanced at run time from the solver's ratio; a backend that repacks weights then holds those weights twice")
	adapt := fs.Bool("adapt", false, "write rows splits over two units as adaptive ones (sched/PLAN.md): in decode the cut moves from token to token by the parts' measured times; each unit prepares its part at 9 cut points")
	compare := fs.Bool("compare", false, "also predict each unit alone, layer- and tensor-level, in order and out of order (always on with --soc)")
	papers := fs.Bool("papers", false, "with --soc: also print the published figures of the papers the SoC description cites next to this simulation's prediction of the same setups")
	setUsage(fs, stderr,
		"usage: xpu plan --model M [--units LIST] [--profile FILE] [-o plan.json] [--prompt N] [--mode tensor|layer|split|single] [--steal | --adapt] [--compare]",
		"       xpu plan --soc "+strings.Join(soc.PlanNames(), "|")+" --model "+strings.Join(soc.ModelNames(), "|")+" [--units cpu,gpu,npu] [-o plan.json] [--papers]",
	)
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 || *model == "" || *prompt < 1 || *ctxLen < 0 || *steal && *adapt {
		fs.Usage()
		return 2
	}
	if *papers && *socName == "" {
		return usageExit(stderr, "xpu plan: --papers compares a simulated SoC (--soc) with published figures; a measured profile has none")
	}
	o := solve.Options{Prompt: *prompt, Context: *ctxLen, Steal: *steal, Adapt: *adapt}
	switch *mode {
	case "tensor":
		o.Mode = solve.Tensor
	case "layer":
		o.Mode = solve.Layer
	case "single":
		o.Mode = solve.Single
	case "split":
		o.Mode = solve.LayerSplit
	default:
		return usageExit(stderr, "xpu plan: --mode %q: tensor, layer, split or single", *mode)
	}
	pol, err := dag.PolicyByName(*policy)
	if err != nil {
		return usageExit(stderr, "xpu plan: --policy: %v", err)
	}
	o.Policy = pol
	if *units != "" {
		for _, u := range strings.Split(*units, ",") {
			o.Units = append(o.Units, strings.TrimSpace(u))
		}
	}
	fail := failer(stderr, "xpu plan")
	var prof *profile.Profile
	var desc *soc.SoC
	switch {
	case *socName != "":
		if desc, err = soc.Load(*socName); err != nil {
			return fail(err)
		}
		md, err := socModel(*model)
		if err != nil {
			return fail(err)
		}
		if prof, err = desc.Profile(md); err != nil {
			return fail(err)
		}
		*compare = true
	case *profFile != "":
		b, err := safefile.ReadFile(*profFile)
		if err != nil {
			return fail(err)
		}
		if prof, err = profile.ParseFile(b, *profFile); err != nil {
			return fail(err)
		}
		// the predictions are the profile's model's: refuse them for another one
		if err := profileFits(prof, *model); err != nil {
			return fail(fmt.Errorf("--profile %s: %w (measure this model with xpu tune --profile --model %s)", *profFile, err, *model))
		}
	default:
		if prof, err = cachedProfile(ctx, *model, *units, stderr); err != nil {
			return fail(err)
		}
		if *units != "" {
			// the profile's unit names are canonical specs
			o.Units = nil
			for _, u := range prof.Units {
				o.Units = append(o.Units, u.Name)
			}
		}
	}
	kind := "MEASURED profile"
	if prof.Simulated() {
		kind = "SIMULATION (" + prof.Source + ")"
	}
	fmt.Fprintf(stdout, "%s of %s: %d layers, dim %d, ffn %d, %s weights. Every time below is PREDICTED by the solver's model from the profile.\n\n",
		kind, prof.Model.Name, prof.Model.Layers, prof.Model.Dim, prof.Model.FFN, prof.Model.DType)
	var rows []solve.Row
	var plan *solve.Plan
	if *compare {
		rows, plan, err = solve.Compare(prof, o)
	} else {
		plan, err = solve.Solve(prof, o)
	}
	if err != nil {
		return fail(err)
	}
	printPlan(stdout, plan)
	if *compare {
		printComparison(stdout, plan, rows)
	}
	if desc != nil && *papers {
		if err := printPapers(stdout, desc, prof.Model); err != nil {
			return fail(err)
		}
	}
	if *out != "" {
		if err := os.WriteFile(*out, plan.File().JSON(), 0o644); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "plan written to %s\n", *out)
	}
	return 0
}

// socModel is a shipped model config by name, or a GGUF file's shapes.
func socModel(name string) (profile.Model, error) {
	md, err := soc.Model(name)
	if err == nil {
		return md, nil
	}
	if _, serr := os.Stat(name); serr != nil {
		return md, err
	}
	m, err := llm.Open(name)
	if err != nil {
		return md, err
	}
	defer m.Close()
	return modelShape(name, m), nil
}

// cachedProfile finds the stored profile of model on units (the key needs the units' plugin
// builds, so it opens them).
func cachedProfile(ctx context.Context, model, units string, stderr io.Writer) (*profile.Profile, error) {
	if units == "" {
		units = defaultProfileUnits
	}
	m, err := llm.Open(model)
	if err != nil {
		return nil, err
	}
	md := modelShape(model, m)
	m.Close()
	pu, err := openProfileUnits(ctx, units, stderr)
	if err != nil {
		return nil, err
	}
	defer pu.close()
	dir, err := profile.CacheDir()
	if err != nil {
		return nil, err
	}
	p, path, err := profile.Load(dir, profile.Key(pu.keyUnits(), md))
	if errors.Is(err, profile.ErrNoProfile) {
		return nil, fmt.Errorf("%w: run `xpu tune --profile --model %s --units %s` first", err, model, units)
	}
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "xpu plan: profile %s\n", path)
	return p, nil
}

func msStr(d time.Duration) string {
	return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond))
}

func printPlan(w io.Writer, p *solve.Plan) {
	fmt.Fprintf(w, "units: %s; solver: %s; prefill dispatch: %s; prompt %d tokens, decode at context %d\n",
		strings.Join(p.Units, ", "), p.Mode, p.Policy, p.Prompt, p.Context)
	for _, ph := range []struct {
		ph, single solve.Phase
	}{{p.Prefill, p.SinglePrefill}, {p.Decode, p.SingleDecode}} {
		x := ph.ph
		what := fmt.Sprintf("one token at context %d", p.Context)
		if x.Name == "prefill" {
			what = fmt.Sprintf("%d tokens in %d chunk(s) of %d", p.Prompt, x.Chunks, x.Rows)
		}
		fmt.Fprintf(w, "\n%s: %s; %s\n", x.Name, what, x.Candidate)
		fmt.Fprintf(w, "  predicted %s = %.1f tok/s, bubble %.1f%% on %s; best single unit (%s): %.1f tok/s\n",
			msStr(x.Time), x.TokPerSec, 100*x.Sim.Bubble, p.Units[x.Sim.Busiest], ph.single.Candidate, ph.single.TokPerSec)
		if x.LayerUnits != nil {
			fmt.Fprintf(w, "  a layer split: every op of a layer on its range's unit (below: layer 0's), the head on the last layer's unit\n")
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  OP\tCLASS\tPLACEMENT\tTIME\tBEST SINGLE\tSPLIT PAYS")
		for i, op := range append(append([]solve.OpPlan{}, x.Layer...), x.Head...) {
			pays := ""
			if op.Choice.Strategy != solve.StrategySingle && op.Time > 0 {
				pays = fmt.Sprintf("%.2f×", op.BestSingleTime.Seconds()/op.Time.Seconds())
			}
			name := op.Op
			if i >= len(x.Layer) {
				name += " (head)"
			}
			best := "-"
			if op.BestSingle >= 0 {
				best = p.Units[op.BestSingle] + " " + msStr(op.BestSingleTime)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", name, op.Class, p.Describe(op.Choice), msStr(op.Time), best, pays)
		}
		tw.Flush()
	}
	if p.Steal {
		fmt.Fprintln(w, "\nrows splits and shards over two units steal (--steal): the units share the rows at run time from these ratios; the times are the static split's")
	}
	if p.Adapt {
		fmt.Fprintln(w, "\nrows splits and shards over two units adapt (--adapt): in decode the cut moves around these ratios by the parts' measured times; the times are the static split's")
	}
	fmt.Fprintln(w, "\nevery layer runs the same placement (the layers have the same shapes), except in a layer split; times are per op, one chunk, average context")
}

func printComparison(w io.Writer, p *solve.Plan, rows []solve.Row) {
	fmt.Fprintf(w, "\ncomparison (PREDICTED, prompt %d, decode at context %d):\n", p.Prompt, p.Context)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  CONFIG\tCHUNK\tDISPATCH\tPREFILL tok/s\tBUBBLE\tDECODE tok/s\tPLAN")
	for _, r := range rows {
		if r.Infeasible != "" {
			fmt.Fprintf(tw, "  %s\t-\t-\t-\t-\t-\tcannot run every op (a unit refuses one)\n", r.Config)
			continue
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%.1f\t%.1f%%\t%.2f\t%s\n", r.Config, r.Prefill.Rows, r.Policy, r.PrefillTokPerSec(p.Prompt),
			100*r.Bubble, r.Decode.TokPerSec, r.Prefill.Candidate)
	}
	tw.Flush()
}

func printPapers(w io.Writer, s *soc.SoC, md profile.Model) error {
	cs, err := s.Compare(md)
	if err != nil {
		return err
	}
	if len(cs) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nagainst the papers (published figures vs this simulation's PREDICTION of the same setup):\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  METRIC\tSETUP\tPAPER\tPREDICTED\tRATIO\tSOURCE")
	for _, c := range cs {
		paper := fmtMetric(c.Figure.Metric, c.Figure.Value)
		if c.Figure.High > 0 {
			paper += "–" + fmtMetric(c.Figure.Metric, c.Figure.High)
		}
		if c.Figure.Bound == "over" {
			paper = "> " + paper
		}
		src, _, _ := strings.Cut(c.Figure.Source, " (")
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%.2f\t%s\n", c.Figure.Metric, c.Figure.Config, paper, fmtMetric(c.Figure.Metric, c.Predicted), c.Ratio, src)
	}
	return tw.Flush()
}

func fmtMetric(metric string, v float64) string {
	if strings.HasSuffix(metric, "tok_s") {
		return fmt.Sprintf("%.1f tok/s", v)
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}

// profileFits checks that prof was measured for a model of model's shapes.
func profileFits(prof *profile.Profile, model string) error {
	m, err := llm.Open(model)
	if err != nil {
		return err
	}
	defer m.Close()
	return prof.Model.Match(modelShape(model, m))
}
