package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/grammar"
	"github.com/xpuhub/xpu/llm/sample"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched"
)

// runUsage is xpu run's synopsis, printed above the flag list.
const runUsage = "usage: xpu run [-m] MODEL.gguf [-p TEXT | -f FILE|-] [-n N] [--stop S]... [--grammar GBNF | --grammar-file FILE | --json-schema SCHEMA|@FILE] [--temp T] [--top-p P] [--top-k K] [-s SEED] [--backend NAME | --policy POLICY | --units LIST | --plan FILE] [--trace FILE] [--cpus-prefill LIST] [--cpus-decode LIST] [--no-aecs] [--spec auto|retrieval|lookup|off] [--w8a8 [--shadow on|off|pruned] [--calib FILE] [--w8a8-convert]] [--sparse auto|on|off [--sidecar FILE] [--budget SIZE] [--predictor trained|oracle] [--recall-every N] [--eviction lru|lfu] [--threshold-offset F] [--io-readers N] [--io-gap SIZE] [--prefetch=false] [--pin-fixed auto|on|off]] [--stats] [--chunk N] [-c N] [--keep N] [--no-context-shift] [-ctk f16|q8_0|q4_0|f32] [-ctv f16|q8_0|q4_0|f32] [-t N] [--isolated [--timeout D]] [--validate]"

// usageError is a flag error printed with the usage: a wrong combination of flags, rather
// than one flag's bad value.
type usageError string

func (e usageError) Error() string { return string(e) }

// runFlags are xpu run's flags by concern. Each group registers its flags and validates them
// before the model loads, so that a bad value is one line on stderr and exit status 2, not a
// load followed by a library error.
type runFlags struct {
	fs      *flag.FlagSet
	in      *inputFlags
	smp     *samplingFlags
	kv      *contextFlags
	place   *placementFlags
	out     *outputFlags
	spec    *specFlags
	w8      *w8a8Flags
	sp      *sparseFlags
	gf      *grammarFlags
	grammar *grammar.Grammar // the compiled --grammar/--grammar-file/--json-schema, nil for none
}

func newRunFlags(stderr io.Writer) *runFlags {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &runFlags{fs: fs}
	f.in = addInputFlags(fs)
	f.smp = addSamplingFlags(fs)
	f.kv = addContextFlags(fs)
	f.place = addPlacementFlags(fs)
	f.out = addOutputFlags(fs)
	f.spec = addSpecFlags(fs, &f.out.stats)
	f.w8 = addW8A8Flags(fs)
	f.sp = addSparseFlags(fs)
	f.gf = addGrammarFlags(fs)
	setUsage(fs, stderr, runUsage)
	return f
}

// parseRunFlags parses and validates args; on a bad one it says so on stderr and returns the
// exit status with ok false.
func parseRunFlags(args []string, stderr io.Writer) (f *runFlags, code int, ok bool) {
	f = newRunFlags(stderr)
	if code, ok := parseInterspersed(f.fs, args); !ok {
		return nil, code, false
	}
	if err := f.validate(stderr); err != nil {
		fmt.Fprintf(stderr, "xpu run: %v\n", err)
		if ue := usageError(""); errors.As(err, &ue) {
			f.fs.Usage()
		}
		return nil, 2, false
	}
	return f, 0, true
}

func (f *runFlags) validate(stderr io.Writer) error {
	p := f.place
	if msg := runFlagCombination(f.fs, &f.in.model, f.in.prompt, f.in.file, p.backend, p.policy, p.units, p.planFile); msg != "" {
		return usageError(msg)
	}
	if err := f.in.validate(); err != nil {
		return err
	}
	if err := f.smp.validate(); err != nil {
		return err
	}
	if err := f.kv.validate(); err != nil {
		return err
	}
	if err := p.validate(stderr); err != nil {
		return err
	}
	return f.validateTechniques()
}

// validateTechniques checks the speculative decoding, grammar, W8A8 and sparse FFN flags and
// how they combine.
func (f *runFlags) validateTechniques() error {
	if err := f.spec.check(); err != nil {
		return err
	}
	g, err := f.gf.compile()
	if err != nil {
		return err
	}
	if g != nil {
		// speculative decoding verifies drafts the grammar has not masked: not combined
		switch *f.spec.mode {
		case "auto":
			*f.spec.mode = "off"
		case "off":
		default:
			return fmt.Errorf("--spec %s cannot be combined with a grammar (--spec off)", *f.spec.mode)
		}
	}
	f.grammar = g
	if err := f.w8.check(); err != nil {
		return err
	}
	return f.sp.check()
}

// inputFlags say what the model reads: the model file, the prompt and where the text ends.
type inputFlags struct {
	model, prompt, file string
	noSpecial           bool
	stops               stringList
	chat                bool
}

func addInputFlags(fs *flag.FlagSet) *inputFlags {
	f := &inputFlags{}
	fs.StringVar(&f.model, "model", "", "GGUF model file (or give it as the argument)")
	fs.StringVar(&f.model, "m", "", "alias of --model")
	fs.StringVar(&f.prompt, "prompt", "", "prompt text (default: start from BOS only)")
	fs.StringVar(&f.prompt, "p", "", "alias of --prompt")
	fs.StringVar(&f.file, "file", "", "read the prompt from this file (- : standard input)")
	fs.StringVar(&f.file, "f", "", "alias of --file")
	fs.BoolVar(&f.noSpecial, "no-special", false, "encode control-token texts in the prompt (\"<|im_start|>\", \"</s>\") as plain text; by default they become the control tokens, as llama.cpp's -p does")
	fs.Var(&f.stops, "stop", "end generation at this text (repeatable)")
	fs.BoolVar(&f.chat, "chat", false, "interactive chat: multi-turn on standard input with the model's chat template, -p as the system prompt; /reset, /exit; Ctrl-C stops an answer")
	fs.BoolVar(&f.chat, "cnv", false, "alias of --chat (llama-cli's)")
	return f
}

// validate reads the prompt of --file.
func (f *inputFlags) validate() error {
	if f.file == "" {
		return nil
	}
	text, err := readPrompt(f.file)
	if err != nil {
		return err
	}
	f.prompt = text
	return nil
}

// samplingFlags choose the next token and how many to generate.
type samplingFlags struct {
	n                  int
	temp, topP, repeat float64
	topK               int
	seed               uint64
}

func addSamplingFlags(fs *flag.FlagSet) *samplingFlags {
	f := &samplingFlags{}
	fs.IntVar(&f.n, "n", 256, "most tokens to generate")
	fs.Float64Var(&f.temp, "temp", 0.8, "sampling temperature; 0 = greedy")
	fs.Float64Var(&f.topP, "top-p", 0.9, "nucleus sampling mass; 1 = off")
	fs.IntVar(&f.topK, "top-k", 40, "keep the k most likely tokens; 0 = off")
	fs.Float64Var(&f.repeat, "repeat-penalty", 1, "penalty for tokens in the last 64; 1 = off")
	fs.Uint64Var(&f.seed, "seed", 0, "sampling seed (0 = from the clock, printed)")
	fs.Uint64Var(&f.seed, "s", 0, "alias of --seed")
	return f
}

func (f *samplingFlags) sampler() sample.Config {
	return sample.Config{Temperature: float32(f.temp), TopP: float32(f.topP), TopK: f.topK,
		RepeatPenalty: float32(f.repeat), Seed: f.seed}
}

// validate checks the values; a bad sampler value would otherwise give NaN logits sampled as
// if greedy.
func (f *samplingFlags) validate() error {
	if f.n < 0 {
		return fmt.Errorf("-n %d: must be 0 (prefill only) or more", f.n)
	}
	return f.sampler().Validate()
}

// contextFlags size the context and its KV cache, and say what happens when it is full.
type contextFlags struct {
	chunk, ctxLen, keep int
	kvf                 *kvFlags
	shift, noShift      bool
	opts                []llm.RunnerOption // the KV cache options, set by validate
}

func addContextFlags(fs *flag.FlagSet) *contextFlags {
	f := &contextFlags{}
	fs.IntVar(&f.chunk, "chunk", llm.DefaultChunk, "prefill chunk length")
	fs.IntVar(&f.ctxLen, "ctx", 0, "context length in tokens (default: the model's, at most 4096)")
	fs.IntVar(&f.ctxLen, "c", 0, "alias of --ctx")
	f.kvf = addKVFlags(fs)
	fs.IntVar(&f.keep, "keep", 0, "tokens of the prompt a context shift keeps, after BOS (-1: the whole prompt); llama.cpp's --keep")
	fs.BoolVar(&f.shift, "context-shift", true, "when the context is full, keep the first --keep tokens, discard half of the rest and go on (llama.cpp's context shift); false stops there")
	fs.BoolVar(&f.noShift, "no-context-shift", false, "stop generating when the context is full (as --context-shift=false)")
	return f
}

func (f *contextFlags) validate() error {
	switch {
	case f.chunk < 1:
		return fmt.Errorf("--chunk %d: must be 1 or more", f.chunk)
	case f.ctxLen < 0:
		return fmt.Errorf("--ctx %d: must be 0 (the model's) or more", f.ctxLen)
	}
	opts, err := f.kvf.options()
	if err != nil {
		return err
	}
	if f.keep < -1 {
		return fmt.Errorf("--keep %d: must be -1 (the whole prompt), 0 or more", f.keep)
	}
	f.opts = opts
	return nil
}

// runnerOptions are the KV cache types, the chunk and the context length.
func (f *contextFlags) runnerOptions() []llm.RunnerOption {
	return append(f.opts[:len(f.opts):len(f.opts)], llm.WithChunkSize(f.chunk), llm.WithContextLength(f.ctxLen))
}

// generateOptions are the context shift's, when it is on.
func (f *contextFlags) generateOptions() []llm.GenerateOption {
	if f.shift && !f.noShift {
		return []llm.GenerateOption{llm.WithContextShift(f.keep)}
	}
	return nil
}

// placementFlags choose where the model runs: the backend, device or units, the cores, and
// how the plugins are loaded.
type placementFlags struct {
	backend, policy, units, planFile string
	device, threads                  int
	isolated, validateABI            bool
	timeout                          time.Duration
	cpusPrefill, cpusDecode          string
	noAECS                           bool
	applySettings                    func() error
	allowRef                         bool        // the reference backend may run: named by --backend or --policy
	cores                            *phaseCores // the per-phase core selection, set by validate
}

func addPlacementFlags(fs *flag.FlagSet) *placementFlags {
	f := &placementFlags{}
	fs.StringVar(&f.backend, "backend", "", "backend name (neon, opencl, qnn, coreml, ref) or plugin path (default: the best usable device, never ref)")
	f.applySettings = backendSettingFlags(fs)
	fs.StringVar(&f.policy, "policy", "", "choose the device by policy instead: prefer-npu, prefer-gpu, prefer-cpu, max-performance (the default), max-efficiency")
	fs.IntVar(&f.device, "device", 0, "device index within --backend")
	fs.BoolVar(&f.isolated, "isolated", false, "run the backend in a child process (crash isolation; see also XPU_ISOLATE)")
	fs.BoolVar(&f.validateABI, "validate", false, "check every plugin ABI call against the ABI's rules (the validation layer; see also XPU_VALIDATE=1)")
	fs.IntVar(&f.threads, "threads", 0, "worker threads for CPU backends (0 = the backend's default)")
	fs.IntVar(&f.threads, "t", 0, "alias of --threads")
	fs.DurationVar(&f.timeout, "timeout", 0, "deadline of one isolated execute; a plugin still running then is killed (0 = 10× its longest earlier run, at least 30s)")
	fs.StringVar(&f.units, "units", "", "run across these units with the default plan, e.g. neon,opencl,qnn or neon{cpus=0,threads=1},neon{cpus=1,threads=1} (see sched/PLAN.md)")
	fs.StringVar(&f.planFile, "plan", "", "run by this placement plan (JSON, see sched/PLAN.md)")
	fs.StringVar(&f.cpusPrefill, "cpus-prefill", "", "run prefill on these CPUs of CPU units, e.g. 0-3 (default: the selection xpu tune --energy stored, else every core)")
	fs.StringVar(&f.cpusDecode, "cpus-decode", "", "run decode on these CPUs of CPU units, e.g. 4,5 (default: as --cpus-prefill)")
	fs.BoolVar(&f.noAECS, "no-aecs", false, "do not use the core selection stored by xpu tune --energy")
	return f
}

// validate checks the values, applies the backend settings and chooses the cores (a stored
// selection is announced on w). Without --backend or --policy the device is the best usable
// one: max-performance's order, without the reference (which only runs when named).
func (f *placementFlags) validate(w io.Writer) error {
	switch {
	case f.threads < 0:
		return fmt.Errorf("--threads %d: must be 0 (the backend's default) or more", f.threads)
	case f.device < 0:
		return fmt.Errorf("--device %d: must be 0 or more", f.device)
	case f.timeout < 0:
		return fmt.Errorf("--timeout %v: must be 0 (automatic) or more", f.timeout)
	}
	if err := f.applySettings(); err != nil {
		return err
	}
	f.allowRef = f.backend != "" || f.policy != ""
	if !f.allowRef {
		f.policy = sched.MaxPerformance.Name()
	}
	cores, err := choosePhaseCores(w, f.cpusPrefill, f.cpusDecode, f.backend, !f.planned(), f.noAECS)
	if err != nil {
		return err
	}
	f.cores = cores
	return nil
}

// planned says the model runs across units (--units or --plan), not on one device.
func (f *placementFlags) planned() bool { return f.units != "" || f.planFile != "" }

// runnerOptions are the CPU threads and cores.
func (f *placementFlags) runnerOptions() []llm.RunnerOption {
	var opts []llm.RunnerOption
	if f.threads > 0 {
		opts = append(opts, llm.WithContextOptions(map[string]string{"threads": fmt.Sprint(f.threads)}))
	}
	return append(opts, f.cores.option()...)
}

func (f *placementFlags) loaderOptions() []loader.Option {
	var opts []loader.Option
	if f.isolated {
		opts = append(opts, loader.Isolated())
	}
	if f.validateABI {
		opts = append(opts, loader.WithValidation())
	}
	return append(opts, loader.WithExecuteTimeout(f.timeout))
}

// outputFlags say what is reported besides the text.
type outputFlags struct {
	stats     bool
	traceFile string
}

func addOutputFlags(fs *flag.FlagSet) *outputFlags {
	f := &outputFlags{}
	fs.BoolVar(&f.stats, "stats", false, "print run statistics: per phase, the busiest unit's bubble rate (its idle share of the phase's wall time; measured, and as the dispatch simulation predicted it), each unit's busy time and the cuts adaptive splits ran at; with speculative decoding, tokens per verify pass, the acceptance histogram and the time split")
	fs.StringVar(&f.traceFile, "trace", "", "write a Chrome trace-event JSON of the run to this file (open it in Perfetto)")
	return f
}
