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
	_ "github.com/xpuhub/xpu/llm/llmconform" // the stories260K model cases of xpu conform
	"github.com/xpuhub/xpu/llm/sparse"
	"github.com/xpuhub/xpu/llm/tokenizer"
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
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	model := fs.String("model", "", "GGUF model file (or give it as the argument)")
	fs.StringVar(model, "m", "", "alias of --model")
	prompt := fs.String("prompt", "", "prompt text (default: start from BOS only)")
	fs.StringVar(prompt, "p", "", "alias of --prompt")
	file := fs.String("file", "", "read the prompt from this file (- : standard input)")
	fs.StringVar(file, "f", "", "alias of --file")
	noSpecial := fs.Bool("no-special", false, "encode control-token texts in the prompt (\"<|im_start|>\", \"</s>\") as plain text; by default they become the control tokens, as llama.cpp's -p does")
	var stops stringList
	fs.Var(&stops, "stop", "end generation at this text (repeatable)")
	n := fs.Int("n", 256, "most tokens to generate")
	temp := fs.Float64("temp", 0.8, "sampling temperature; 0 = greedy")
	topP := fs.Float64("top-p", 0.9, "nucleus sampling mass; 1 = off")
	topK := fs.Int("top-k", 40, "keep the k most likely tokens; 0 = off")
	repeat := fs.Float64("repeat-penalty", 1, "penalty for tokens in the last 64; 1 = off")
	seed := fs.Uint64("seed", 0, "sampling seed (0 = from the clock, printed)")
	fs.Uint64Var(seed, "s", 0, "alias of --seed")
	backend := fs.String("backend", "", "backend name (neon, opencl, qnn, coreml, ref) or plugin path (default: the best usable device, never ref)")
	applyUnits := backendSettingFlags(fs)
	policy := fs.String("policy", "", "choose the device by policy instead: prefer-npu, prefer-gpu, prefer-cpu, max-performance (the default), max-efficiency")
	device := fs.Int("device", 0, "device index within --backend")
	chunk := fs.Int("chunk", llm.DefaultChunk, "prefill chunk length")
	ctxLen := fs.Int("ctx", 0, "context length in tokens (default: the model's, at most 4096)")
	fs.IntVar(ctxLen, "c", 0, "alias of --ctx")
	kvf := addKVFlags(fs)
	keep := fs.Int("keep", 0, "tokens of the prompt a context shift keeps, after BOS (-1: the whole prompt); llama.cpp's --keep")
	shift := fs.Bool("context-shift", true, "when the context is full, keep the first --keep tokens, discard half of the rest and go on (llama.cpp's context shift); false stops there")
	noShift := fs.Bool("no-context-shift", false, "stop generating when the context is full (as --context-shift=false)")
	chatMode := fs.Bool("chat", false, "interactive chat: multi-turn on standard input with the model's chat template, -p as the system prompt; /reset, /exit; Ctrl-C stops an answer")
	fs.BoolVar(chatMode, "cnv", false, "alias of --chat (llama-cli's)")
	isolated := fs.Bool("isolated", false, "run the backend in a child process (crash isolation; see also XPU_ISOLATE)")
	validate := fs.Bool("validate", false, "check every plugin ABI call against the ABI's rules (the validation layer; see also XPU_VALIDATE=1)")
	threads := fs.Int("threads", 0, "worker threads for CPU backends (0 = the backend's default)")
	timeout := fs.Duration("timeout", 0, "deadline of one isolated execute; a plugin still running then is killed (0 = 10× its longest earlier run, at least 30s)")
	fs.IntVar(threads, "t", 0, "alias of --threads")
	units := fs.String("units", "", "run across these units with the default plan, e.g. neon,opencl,qnn or neon{cpus=0,threads=1},neon{cpus=1,threads=1} (see sched/PLAN.md)")
	planFile := fs.String("plan", "", "run by this placement plan (JSON, see sched/PLAN.md)")
	stats := fs.Bool("stats", false, "print run statistics: per phase, the busiest unit's bubble rate (its idle share of the phase's wall time; measured, and as the dispatch simulation predicted it), each unit's busy time and the cuts adaptive splits ran at; with speculative decoding, tokens per verify pass, the acceptance histogram and the time split")
	traceFile := fs.String("trace", "", "write a Chrome trace-event JSON of the run to this file (open it in Perfetto)")
	cpusPrefill := fs.String("cpus-prefill", "", "run prefill on these CPUs of CPU units, e.g. 0-3 (default: the selection xpu tune --energy stored, else every core)")
	cpusDecode := fs.String("cpus-decode", "", "run decode on these CPUs of CPU units, e.g. 4,5 (default: as --cpus-prefill)")
	noAECS := fs.Bool("no-aecs", false, "do not use the core selection stored by xpu tune --energy")
	spec := addSpecFlags(fs, stats)
	w8 := addW8A8Flags(fs)
	sp := addSparseFlags(fs)
	gf := addGrammarFlags(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: xpu run [-m] MODEL.gguf [-p TEXT | -f FILE|-] [-n N] [--stop S]... [--grammar GBNF | --grammar-file FILE | --json-schema SCHEMA|@FILE] [--temp T] [--top-p P] [--top-k K] [-s SEED] [--backend NAME | --policy POLICY | --units LIST | --plan FILE] [--trace FILE] [--cpus-prefill LIST] [--cpus-decode LIST] [--no-aecs] [--spec auto|retrieval|lookup|off] [--w8a8 [--shadow on|off|pruned] [--calib FILE] [--w8a8-convert]] [--sparse auto|on|off [--sidecar FILE] [--budget SIZE] [--predictor trained|oracle] [--recall-every N] [--eviction lru|lfu] [--threshold-offset F] [--io-readers N] [--io-gap SIZE] [--prefetch=false] [--pin-fixed auto|on|off]] [--stats] [--chunk N] [-c N] [--keep N] [--no-context-shift] [-ctk f16|q8_0|q4_0|f32] [-ctv f16|q8_0|q4_0|f32] [-t N] [--isolated [--timeout D]] [--validate]")
		fs.PrintDefaults()
	}
	if code, ok := parseInterspersed(fs, args); !ok {
		return code
	}
	if msg := runFlagCombination(fs, model, *prompt, *file, *backend, *policy, *units, *planFile); msg != "" {
		fmt.Fprintf(stderr, "xpu run: %s\n", msg)
		fs.Usage()
		return 2
	}
	if *threads < 0 {
		fmt.Fprintf(stderr, "xpu run: --threads %d: must be 0 (the backend's default) or more\n", *threads)
		return 2
	}
	if *file != "" {
		text, err := readPrompt(*file)
		if err != nil {
			fmt.Fprintf(stderr, "xpu run: %v\n", err)
			return 2
		}
		*prompt = text
	}
	if err := applyUnits(); err != nil {
		fmt.Fprintf(stderr, "xpu run: %v\n", err)
		return 2
	}
	// Without --backend or --policy the device is the best usable one: max-performance's
	// order, without the reference (which only runs when named).
	allowRef := *backend != "" || *policy != ""
	if *backend == "" && *policy == "" {
		*policy = sched.MaxPerformance.Name()
	}
	s := llm.SamplerConfig{Temperature: float32(*temp), TopP: float32(*topP), TopK: *topK,
		RepeatPenalty: float32(*repeat), Seed: *seed}
	if err := runValues(*n, *chunk, *ctxLen, *device, s); err != nil {
		fmt.Fprintf(stderr, "xpu run: %v\n", err)
		return 2
	}
	if err := spec.check(); err != nil {
		fmt.Fprintf(stderr, "xpu run: %v\n", err)
		return 2
	}
	g, err := gf.compile()
	if err != nil {
		fmt.Fprintf(stderr, "xpu run: %v\n", err)
		return 2
	}
	if g != nil {
		// speculative decoding verifies drafts the grammar has not masked: not combined
		switch *spec.mode {
		case "auto":
			*spec.mode = "off"
		case "off":
		default:
			fmt.Fprintf(stderr, "xpu run: --spec %s cannot be combined with a grammar (--spec off)\n", *spec.mode)
			return 2
		}
	}
	if err := w8.check(); err != nil {
		fmt.Fprintf(stderr, "xpu run: %v\n", err)
		return 2
	}
	if err := sp.check(); err != nil {
		fmt.Fprintf(stderr, "xpu run: %v\n", err)
		return 2
	}
	if *timeout < 0 {
		fmt.Fprintf(stderr, "xpu run: --timeout %v: must be 0 (automatic) or more\n", *timeout)
		return 2
	}
	cores, err := choosePhaseCores(stderr, *cpusPrefill, *cpusDecode, *backend, *units == "" && *planFile == "", *noAECS)
	if err != nil {
		fmt.Fprintf(stderr, "xpu run: %v\n", err)
		return 2
	}
	ropts, err := kvf.options()
	if err == nil && *keep < -1 {
		err = fmt.Errorf("--keep %d: must be -1 (the whole prompt), 0 or more", *keep)
	}
	if err != nil {
		fmt.Fprintf(stderr, "xpu run: %v\n", err)
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "xpu run: %v\n", err)
		return 1
	}
	t0 := time.Now()
	m, err := llm.Open(*model)
	if err != nil {
		return fail(err)
	}
	defer m.Close()

	ropts = append(ropts, llm.WithChunkSize(*chunk), llm.WithContextLength(*ctxLen))
	low, err := w8.lowering(m, stderr)
	if err != nil {
		return fail(err)
	}
	if low != nil {
		ropts = append(ropts, llm.WithW8A8(low))
	}
	spath, err := sp.path(*model)
	if err != nil {
		return fail(err)
	}
	var srt *sparse.Runtime
	if spath != "" {
		if flagSet(fs, "spec") && *spec.mode != "off" {
			return fail(fmt.Errorf("--spec %s does not combine with the sparse FFN (give --sparse off, or leave --spec out)", *spec.mode))
		}
		*spec.mode = "off" // verify graphs do not combine with the sparse FFN's
		var sc *sparse.Sidecar
		if srt, sc, err = sp.open(ctx, m, spath, *ctxLen, kvf.kType()); err != nil {
			return fail(err)
		}
		defer sc.Close()
		defer srt.Close()
		ropts = append(ropts, llm.WithSparseFFN(srt))
		fmt.Fprintf(stderr, "sparse FFN: %s\n", spath)
		// Each prefill chunk length has its own programs, whose intermediates (about 6 MiB per
		// layer stage at chunk 64 for a 7B model) the budget does not count: under a budget
		// below the model they could take the memory the budget promised to stay within.
		if tightBudget(srt.Stats().Budget, m) && !flagSet(fs, "chunk") {
			ropts = append(ropts, llm.WithChunkSize(1))
			fmt.Fprintln(stderr, "sparse FFN: budget below the model: the prompt runs one token at a time on the decode programs (--chunk N for chunked prefill, at its memory)")
		}
	}
	if *threads > 0 {
		ropts = append(ropts, llm.WithContextOptions(map[string]string{"threads": fmt.Sprint(*threads)}))
	}
	ropts = append(ropts, cores.option()...)
	if !*chatMode {
		ctxTokens := *ctxLen
		if ctxTokens == 0 {
			ctxTokens = llm.DefaultContextLength(m)
		}
		so, err := spec.runnerOptions(*temp, ctxTokens)
		if err != nil {
			fmt.Fprintf(stderr, "xpu run: %v\n", err)
			return 2
		}
		ropts = append(ropts, so...)
	}
	if m.WeightBytes() >= progressMinBytes && isTerminal(stderr) {
		ropts = append(ropts, llm.WithProgress(func(done, total int) { drawProgress(stderr, done, total) }))
	}
	var lopts []loader.Option
	if *isolated {
		lopts = append(lopts, loader.Isolated())
	}
	if *validate {
		lopts = append(lopts, loader.WithValidation())
	}
	lopts = append(lopts, loader.WithExecuteTimeout(*timeout))
	var tr *sched.Trace
	if *traceFile != "" {
		tr = sched.NewTrace()
		ropts = append(ropts, llm.WithTrace(tr))
	}
	var r *llm.Runner
	var closers []io.Closer
	if *units != "" || *planFile != "" {
		var backends []core.Backend
		r, backends, err = openPlannedRunner(ctx, m, *units, *planFile, low != nil, spath != "", ropts, lopts...)
		for _, b := range backends {
			closers = append(closers, b)
		}
	} else {
		r, closers, err = openRunner(ctx, m, *backend, *policy, *device, allowRef, ropts, lopts...)
	}
	for _, c := range closers {
		defer c.Close()
	}
	if err != nil {
		return fail(err)
	}
	defer r.Close()
	if err := cores.announce(stderr, r); err != nil {
		return fail(err)
	}
	info := r.Device().Info()
	fmt.Fprintf(stderr, "load: %.0f ms (%s, %s, %.1f MB of weights on %s, %s)\n",
		ms(time.Since(t0)), m.Config.Arch, describe(m), float64(m.WeightBytes())/1e6, strings.Join(r.Units(), ","), deviceTag(info))
	printKVCache(stderr, r)
	if len(r.Units()) > 1 {
		fmt.Fprintf(stderr, "placement:\n%s\n", r.Placement())
	}

	if s.Seed == 0 && s.Temperature > 0 {
		s.Seed = uint64(time.Now().UnixNano())
		fmt.Fprintf(stderr, "seed: %d (from the clock; --seed %d repeats this run)\n", s.Seed, s.Seed)
	}
	genOpts := []llm.GenerateOption{llm.WithMaxTokens(*n), llm.WithSampler(s)}
	if *shift && !*noShift {
		genOpts = append(genOpts, llm.WithContextShift(*keep))
	}
	if g != nil {
		genOpts = append(genOpts, llm.WithConstraint(llm.GrammarConstraint(r.Model().Tokenizer, g)))
	}
	if *chatMode {
		intr, stopIntr := interrupts()
		defer stopIntr()
		return chatLoop(ctx, r, chatIO{in: stdin, out: stdout, errw: stderr, interrupts: intr},
			*prompt, stops, genOpts...)
	}
	specOpts, err := spec.generateOptions(m, *temp, r.ContextLength(), stderr)
	if err != nil {
		return fail(err)
	}
	if *noSpecial {
		ids := r.Model().Tokenizer.EncodeWith(*prompt, tokenizer.AddSpecial(true), tokenizer.ParseSpecial(false))
		specOpts = append(specOpts, llm.WithPromptTokens(ids))
	}
	fmt.Fprint(stdout, *prompt)
	res, err := r.GenerateUntil(ctx, *prompt, stops, append(append(genOpts,
		llm.WithStream(func(text string) error {
			_, err := io.WriteString(stdout, text)
			return err
		})), specOpts...)...)
	fmt.Fprintln(stdout)
	if err != nil {
		return fail(err)
	}
	fmt.Fprintf(stderr, "prefill: %d tokens in %.1f ms, %.1f tok/s (chunk %d)\n", res.PromptTokens,
		ms(res.Prefill), res.PrefillTokensPerSecond(), r.ChunkSize())
	// Each decoded token streams every weight once: weight bytes × tok/s is the bandwidth
	// decode achieves, to hold against the machine's read bandwidth.
	fmt.Fprintf(stderr, "decode: %d tokens in %.1f ms, %.1f tok/s, %.2f GB/s of weights (stop: %s)\n",
		len(res.Tokens), ms(res.Decode), res.DecodeTokensPerSecond(),
		float64(m.WeightBytes())*res.DecodeTokensPerSecond()/1e9, res.Stop)
	if *stats && res.DecodeCPU > 0 && len(res.Tokens) > 1 {
		// steadier than the wall clock where other processes share the cores
		fmt.Fprintf(stderr, "decode cpu: %.1f ms, %.1f µs per token (this process's threads, user + system)\n",
			ms(res.DecodeCPU), float64(res.DecodeCPU.Microseconds())/float64(len(res.Tokens)-1))
	}
	if *spec.stats {
		printSpecStats(stderr, res)
	}
	if len(r.Units()) > 1 {
		fmt.Fprintf(stderr, "units:\n%s\n", r.Report())
	}
	if *stats {
		// the device's own words: for the CPU plugin, its build and the int8 path its kernels
		// take, so that a figure is never read as another instruction set's
		fmt.Fprintf(stderr, "device: %s: %s\n", info.ID(), info.Name)
		printSchedStats(stderr, r.Report())
		if srt != nil {
			fmt.Fprintf(stderr, "sparse FFN:\n%s\n", srt.Stats())
			pt, dt := r.SparseTimes()
			fmt.Fprintf(stderr, "  prefill timeline: %s\n  decode timeline: %s\n", pt, dt)
		}
	}
	if tr != nil {
		if err := tr.WriteFile(*traceFile); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stderr, "trace: %s (%d events; open in https://ui.perfetto.dev)\n", *traceFile, tr.Len())
	}
	return 0
}

// runValues checks run's numeric flags before the model loads, so that a bad value is one line
// on stderr and exit status 2, not a load followed by a library error (or, for the sampler, NaN
// logits sampled as if greedy).
func runValues(n, chunk, ctxLen, device int, s llm.SamplerConfig) error {
	switch {
	case n < 0:
		return fmt.Errorf("-n %d: must be 0 (prefill only) or more", n)
	case chunk < 1:
		return fmt.Errorf("--chunk %d: must be 1 or more", chunk)
	case ctxLen < 0:
		return fmt.Errorf("--ctx %d: must be 0 (the model's) or more", ctxLen)
	case device < 0:
		return fmt.Errorf("--device %d: must be 0 or more", device)
	}
	return s.Validate()
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
// the listed units with the default plan (llm.DefaultPlan; with w8a8, adapted by
// llm.W8A8Plan so each activation is quantized on its int8 MATMUL's unit; with the sparse FFN,
// without decode shards).
func openPlannedRunner(ctx context.Context, m *llm.Model, units, planFile string, w8a8, sparseFFN bool, opts []llm.RunnerOption,
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
		case w8a8:
			plan = llm.W8A8Plan(plan)
		case sparseFFN:
			plan = llm.WithoutShards(plan)
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
