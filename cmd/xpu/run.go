package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/grammar"
	_ "github.com/xpuhub/xpu/llm/llmconform" // the stories260K model cases of xpu conform
	"github.com/xpuhub/xpu/llm/shard"        // imported, it runs plans with decode shards (the default plan's too)
	"github.com/xpuhub/xpu/llm/sparse"
	"github.com/xpuhub/xpu/llm/tokenizer"
	"github.com/xpuhub/xpu/llm/w8a8"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched"
	"golang.org/x/term"
)

func init() {
	register(&command{name: "run", summary: "generate text with a GGUF model", run: runRun})
}

// progressMinBytes: models this large get a progress bar while their graphs are prepared
// (which uploads the weights); small ones load too fast for it to be seen.
const progressMinBytes = 64 << 20

func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, code, ok := parseRunFlags(args, stderr)
	if !ok {
		return code
	}
	fail := failer(stderr, "xpu run")
	t0 := time.Now()
	m, err := llm.Open(f.in.model)
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	tech, err := f.openTechniques(ctx, m, stderr)
	defer tech.close()
	if err != nil {
		return fail(err)
	}
	ropts, err := f.runnerOptions(m, tech, stderr)
	if err != nil {
		return usageExit(stderr, "xpu run: %v", err)
	}
	var tr *sched.Trace
	if f.out.traceFile != "" {
		tr = sched.NewTrace()
		ropts = append(ropts, llm.WithTrace(tr))
	}
	r, closers, err := f.place.open(ctx, m, tech.w8a8, tech.sparse != nil, ropts)
	for _, c := range closers {
		defer c.Close()
	}
	if err != nil {
		return fail(err)
	}
	defer r.Close()
	if err := f.place.cores.announce(stderr, r); err != nil {
		return fail(err)
	}
	printLoad(stderr, m, r, time.Since(t0))
	genOpts := f.generateOptions(r, stderr)
	if f.in.chat {
		intr, stopIntr := interrupts()
		defer stopIntr()
		return chatLoop(ctx, r, chatIO{in: stdin, out: stdout, errw: stderr, interrupts: intr},
			f.in.prompt, f.in.stops, genOpts...)
	}
	res, err := f.generate(ctx, r, stdout, stderr, genOpts)
	if err != nil {
		return fail(err)
	}
	f.report(stderr, r, res, tech.sparse)
	if tr != nil {
		if err := tr.WriteFile(f.out.traceFile); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stderr, "trace: %s (%d events; open in https://ui.perfetto.dev)\n", f.out.traceFile, tr.Len())
	}
	return 0
}

// runTechniques is what the W8A8 and sparse FFN flags opened for a run.
type runTechniques struct {
	w8a8    bool
	sparse  *sparse.Runtime
	closers []io.Closer // closed last first
	opts    []llm.RunnerOption
}

func (t *runTechniques) close() {
	for i := len(t.closers) - 1; i >= 0; i-- {
		t.closers[i].Close()
	}
}

// openTechniques prepares the W8A8 lowering and opens the sparse FFN's sidecar and runtime,
// as the flags ask. What it opened is in the result even on an error, for closing.
func (f *runFlags) openTechniques(ctx context.Context, m *llm.Model, stderr io.Writer) (*runTechniques, error) {
	t := &runTechniques{}
	low, err := f.w8.lowering(m, stderr)
	if err != nil {
		return t, err
	}
	if low != nil {
		t.w8a8 = true
		t.opts = append(t.opts, w8a8.WithLowering(low))
	}
	spath, err := f.sp.path(f.in.model)
	if err != nil || spath == "" {
		return t, err
	}
	if flagSet(f.fs, "spec") && *f.spec.mode != "off" {
		return t, fmt.Errorf("--spec %s does not combine with the sparse FFN (give --sparse off, or leave --spec out)", *f.spec.mode)
	}
	*f.spec.mode = "off" // verify graphs do not combine with the sparse FFN's
	srt, sc, err := f.sp.open(ctx, m, spath, f.kv.ctxLen, f.kv.kvf.kType())
	if err != nil {
		return t, err
	}
	t.sparse = srt
	t.closers = append(t.closers, sc, srt)
	t.opts = append(t.opts, sparse.WithFFN(srt))
	fmt.Fprintf(stderr, "sparse FFN: %s\n", spath)
	// Each prefill chunk length has its own programs, whose intermediates (about 6 MiB per
	// layer stage at chunk 64 for a 7B model) the budget does not count: under a budget
	// below the model they could take the memory the budget promised to stay within.
	if tightBudget(srt.Stats().Budget, m) && !flagSet(f.fs, "chunk") {
		t.opts = append(t.opts, llm.WithChunkSize(1))
		fmt.Fprintln(stderr, "sparse FFN: budget below the model: the prompt runs one token at a time on the decode programs (--chunk N for chunked prefill, at its memory)")
	}
	return t, nil
}

// runnerOptions gathers every group's runner options; an error is a flag value the model
// does not allow (speculative decoding's verify lengths against its context).
func (f *runFlags) runnerOptions(m *llm.Model, tech *runTechniques, stderr io.Writer) ([]llm.RunnerOption, error) {
	ropts := append(f.kv.runnerOptions(), tech.opts...)
	ropts = append(ropts, f.place.runnerOptions()...)
	if !f.in.chat {
		ctxTokens := f.kv.ctxLen
		if ctxTokens == 0 {
			ctxTokens = llm.DefaultContextLength(m)
		}
		so, err := f.spec.runnerOptions(f.smp.temp, ctxTokens)
		if err != nil {
			return nil, err
		}
		ropts = append(ropts, so...)
	}
	if m.WeightBytes() >= progressMinBytes && isTerminal(stderr) {
		ropts = append(ropts, llm.WithProgress(func(done, total int) { drawProgress(stderr, done, total) }))
	}
	return ropts, nil
}

// open opens the backends and prepares the model where the flags place it; what it opened is
// returned for closing, also on an error.
func (f *placementFlags) open(ctx context.Context, m *llm.Model, w8a8, sparseFFN bool, ropts []llm.RunnerOption) (*llm.Runner, []io.Closer, error) {
	lopts := f.loaderOptions()
	if !f.planned() {
		return openRunner(ctx, m, f.backend, f.policy, f.device, f.allowRef, ropts, lopts...)
	}
	r, backends, err := openPlannedRunner(ctx, m, f.units, f.planFile, w8a8, sparseFFN, ropts, lopts...)
	closers := make([]io.Closer, 0, len(backends))
	for _, b := range backends {
		closers = append(closers, b)
	}
	return r, closers, err
}

// printLoad is the lines after the model loads: where it runs, its KV cache and placement.
func printLoad(w io.Writer, m *llm.Model, r *llm.Runner, took time.Duration) {
	fmt.Fprintf(w, "load: %.0f ms (%s, %s, %.1f MB of weights on %s, %s)\n",
		ms(took), m.Config.Arch, describe(m), float64(m.WeightBytes())/1e6, strings.Join(r.Units(), ","), deviceTag(r.Device().Info()))
	printKVCache(w, r)
	if len(r.Units()) > 1 {
		fmt.Fprintf(w, "placement:\n%s\n", r.Placement())
	}
}

// generateOptions are the sampler's (with a seed drawn from the clock, printed, when none is
// given), the context shift's and the grammar's.
func (f *runFlags) generateOptions(r *llm.Runner, stderr io.Writer) []llm.GenerateOption {
	s := f.smp.sampler()
	if s.Seed == 0 && s.Temperature > 0 {
		s.Seed = uint64(time.Now().UnixNano())
		fmt.Fprintf(stderr, "seed: %d (from the clock; --seed %d repeats this run)\n", s.Seed, s.Seed)
	}
	opts := append([]llm.GenerateOption{llm.WithMaxTokens(f.smp.n), llm.WithSampler(s)}, f.kv.generateOptions()...)
	if f.grammar != nil {
		opts = append(opts, llm.WithConstraint(grammar.NewTokenMatcher(f.grammar, r.Model().Tokenizer)))
	}
	return opts
}

// generate streams the prompt and its continuation to stdout.
func (f *runFlags) generate(ctx context.Context, r *llm.Runner, stdout, stderr io.Writer, genOpts []llm.GenerateOption) (llm.Result, error) {
	specOpts, err := f.spec.generateOptions(r.Model(), f.smp.temp, r.ContextLength(), stderr)
	if err != nil {
		return llm.Result{}, err
	}
	if f.in.noSpecial {
		ids := r.Model().Tokenizer.EncodeWith(f.in.prompt, tokenizer.AddSpecial(true), tokenizer.ParseSpecial(false))
		specOpts = append(specOpts, llm.WithPromptTokens(ids))
	}
	fmt.Fprint(stdout, f.in.prompt)
	res, err := r.GenerateUntil(ctx, f.in.prompt, f.in.stops, append(append(genOpts,
		llm.WithStream(func(text string) error {
			_, err := io.WriteString(stdout, text)
			return err
		})), specOpts...)...)
	fmt.Fprintln(stdout)
	return res, err
}

// report is the lines after generation: prefill and decode speed, and with --stats the
// scheduling, speculative decoding and sparse FFN statistics.
func (f *runFlags) report(w io.Writer, r *llm.Runner, res llm.Result, srt *sparse.Runtime) {
	m := r.Model()
	fmt.Fprintf(w, "prefill: %d tokens in %.1f ms, %.1f tok/s (chunk %d)\n", res.PromptTokens,
		ms(res.Prefill), res.PrefillTokensPerSecond(), r.ChunkSize())
	// Each decoded token streams every weight once: weight bytes × tok/s is the bandwidth
	// decode achieves, to hold against the machine's read bandwidth.
	fmt.Fprintf(w, "decode: %d tokens in %.1f ms, %.1f tok/s, %.2f GB/s of weights (stop: %s)\n",
		len(res.Tokens), ms(res.Decode), res.DecodeTokensPerSecond(),
		float64(m.WeightBytes())*res.DecodeTokensPerSecond()/1e9, res.Stop)
	if f.out.stats && res.DecodeCPU > 0 && len(res.Tokens) > 1 {
		// steadier than the wall clock where other processes share the cores
		fmt.Fprintf(w, "decode cpu: %.1f ms, %.1f µs per token (this process's threads, user + system)\n",
			ms(res.DecodeCPU), float64(res.DecodeCPU.Microseconds())/float64(len(res.Tokens)-1))
	}
	if *f.spec.stats {
		printSpecStats(w, res)
	}
	if len(r.Units()) > 1 {
		fmt.Fprintf(w, "units:\n%s\n", r.Report())
	}
	if f.out.stats {
		// the device's own words: for the CPU plugin, its build and the int8 path its kernels
		// take, so that a figure is never read as another instruction set's
		info := r.Device().Info()
		fmt.Fprintf(w, "device: %s: %s\n", info.ID(), info.Name)
		printSchedStats(w, r.Report())
		if srt != nil {
			fmt.Fprintf(w, "sparse FFN:\n%s\n", srt.Stats())
			pt, dt := sparse.TimesOf(r)
			fmt.Fprintf(w, "  prefill timeline: %s\n  decode timeline: %s\n", pt, dt)
		}
	}
}

// countSet counts the non-empty strings: the ways to choose devices exclude each other.
func countSet(ss ...string) int {
	n := 0
	for _, s := range ss {
		if s != "" {
			n++
		}
	}
	return n
}

// openPlannedRunner opens every backend and runs the model on the units of the plan file, or on
// the listed units with the default plan (llm.DefaultPlan; with int8 (W8A8) weights, adapted by
// w8a8.Plan so each activation is quantized on its int8 MATMUL's unit; with the sparse FFN,
// without decode shards).
func openPlannedRunner(ctx context.Context, m *llm.Model, units, planFile string, int8, sparseFFN bool, opts []llm.RunnerOption,
	lopts ...loader.Option) (*llm.Runner, []core.Backend, error) {
	var plan *sched.Plan
	var specs []sched.UnitSpec
	var err error
	if planFile != "" {
		if plan, err = sched.LoadPlan(planFile); err != nil {
			return nil, nil, err
		}
	} else if specs, err = sched.ParseUnitList(units); err != nil {
		return nil, nil, err
	}
	backends, _, err := loader.OpenAll(ctx, lopts...)
	if err != nil {
		return nil, backends, err
	}
	backends = append(backends, ref.New())
	var devs []core.Device
	for _, b := range backends {
		devs = append(devs, b.Devices()...)
	}
	if plan == nil {
		if plan, err = llm.DefaultPlan(m, devs, specs); err != nil {
			return nil, backends, err
		}
		switch {
		case int8:
			plan = w8a8.Plan(plan)
		case sparseFFN:
			plan = shard.Without(plan)
		}
	}
	r, err := llm.NewPlannedRunner(ctx, m, devs, plan, opts...)
	return r, backends, err
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func describe(m *llm.Model) string {
	c := m.Config
	return fmt.Sprintf("%d layers, dim %d, %d/%d heads, vocab %d", c.Layers, c.Dim, c.Heads, c.KVHeads, c.Vocab)
}

func drawProgress(w io.Writer, done, total int) {
	const width = 30
	filled := width * done / max(total, 1)
	fmt.Fprintf(w, "\rpreparing [%s%s] %d/%d", strings.Repeat("=", filled), strings.Repeat(" ", width-filled), done, total)
	if done == total {
		fmt.Fprintln(w)
	}
}

// openRunner opens the named backend, or when a policy chooses, the plugins of the devices it
// ranks first, one by one, and prepares the model on the first device that accepts every
// stage. The whole model goes to one device; what it opened is returned for closing.
func openRunner(ctx context.Context, m *llm.Model, name, policy string, devIndex int, allowRef bool,
	opts []llm.RunnerOption, lopts ...loader.Option) (*llm.Runner, []io.Closer, error) {
	if policy == "" {
		if name == "" {
			name = loader.RefName
		}
		b, err := loader.Open(ctx, name, lopts...)
		if err != nil {
			return nil, nil, err
		}
		devs := b.Devices()
		if devIndex < 0 || devIndex >= len(devs) {
			return nil, []io.Closer{b}, fmt.Errorf("backend %s has %d devices, no index %d: %w", name, len(devs), devIndex, core.ErrNotFound)
		}
		r, err := llm.NewRunner(ctx, m, devs[devIndex], opts...)
		return r, []io.Closer{b}, err
	}
	p, err := sched.ParsePolicy(policy)
	if err != nil {
		return nil, nil, err
	}
	// the policy ranks the devices as their plugins last listed them; only the plugin of the
	// device that takes the model opens (a run on the CPU plugin opens no OpenCL or NPU runtime)
	lazy, err := loader.OpenLazy(ctx, lopts...)
	if err != nil {
		return nil, nil, err
	}
	closers := []io.Closer{lazy}
	devs := lazy.Devices()
	if allowRef {
		rb := ref.New()
		closers = append(closers, rb)
		devs = append(devs, rb.Devices()...)
	}
	ranked := p.Rank(llm.RepresentativeMatMul(m), devs)
	var errs []error
	for _, d := range ranked {
		real, err := lazy.Open(ctx, d)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.Info().ID(), err))
			continue
		}
		r, err := llm.NewRunner(ctx, m, real, opts...)
		if err == nil {
			return r, closers, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", d.Info().ID(), err))
	}
	if len(ranked) == 0 {
		errs = append(errs, fmt.Errorf("policy %s ranks no device (no plugin found; --backend ref runs the slow reference): %w", p.Name(), core.ErrNotFound))
	}
	return nil, closers, errors.Join(errs...)
}

// runFlagCombination says what is wrong with a combination of run's flags ("" when nothing);
// a positional argument becomes the model.
func runFlagCombination(fs *flag.FlagSet, model *string, prompt, file, backend, policy, units, planFile string) string {
	switch {
	case fs.NArg() > 1:
		return fmt.Sprintf("one model, got %d arguments: %s", fs.NArg(), strings.Join(fs.Args(), " "))
	case fs.NArg() == 1 && *model != "":
		return fmt.Sprintf("the model is given twice (--model %s and %s)", *model, fs.Arg(0))
	case fs.NArg() == 1:
		*model = fs.Arg(0)
	}
	switch {
	case *model == "":
		return "no model: give -m MODEL.gguf or the path as the argument"
	case countSet(backend, policy, units, planFile) > 1:
		return "--backend, --policy, --units and --plan each choose where the model runs: give one"
	case prompt != "" && file != "":
		return "--prompt and --file both give the prompt: give one"
	}
	return ""
}

// stdin is where `--file -` reads the prompt (a variable for tests).
var stdin io.Reader = os.Stdin

// maxPromptBytes bounds a prompt read from a file or standard input.
const maxPromptBytes = 16 << 20

func readPrompt(path string) (string, error) {
	var r io.Reader = stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return "", fmt.Errorf("--file: %w", err)
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxPromptBytes+1))
	if err != nil {
		return "", fmt.Errorf("--file %s: %w", path, err)
	}
	if len(b) > maxPromptBytes {
		return "", fmt.Errorf("--file %s: the prompt is over %d MiB", path, maxPromptBytes>>20)
	}
	return string(b), nil
}

// isTerminal says w is a terminal: progress bars are drawn there and never into a log file or
// a pipe, where carriage returns make a mess.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// printSchedStats is --stats' block: per phase the busiest unit's bubble rate, then each
// unit's busy share of the phase.
func printSchedStats(w io.Writer, rep sched.RuntimeReport) {
	fmt.Fprintln(w, "scheduling:")
	for _, ps := range rep.Phases {
		fmt.Fprintf(w, "  %s\n", ps)
		for u, b := range ps.Busy {
			if b == 0 || u >= len(rep.Units) {
				continue
			}
			fmt.Fprintf(w, "    %-28s busy %9.1f ms (%5.1f%%)\n", rep.Units[u].Unit, ms(b), 100*float64(b)/float64(max(ps.Wall, 1)))
		}
	}
}
