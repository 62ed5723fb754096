package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/kernelbench"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/kvcache"
	"github.com/xpuhub/xpu/llm/llmbench"
	"github.com/xpuhub/xpu/loader"
)

func init() {
	register(&command{name: "bench", summary: "model benchmark like llama-bench (-m MODEL), or the CPU kernel suite (--kernels)", run: runBench})
}

// defaultHarness is where `make bench-neon` builds the OpenBLAS harness.
var defaultHarness = filepath.Join("build", "bench", "libxpubench.so")

// intList is a comma-separated list flag, llama-bench's "-p 128,512".
type intList []int

func (l *intList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (l *intList) Set(v string) error {
	var out intList
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return fmt.Errorf("%q: want comma-separated counts ≥ 0", v)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}

// pairList is llama-bench's repeatable "-pg 512,128".
type pairList [][2]int

func (l *pairList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, p := range *l {
		s[i] = fmt.Sprintf("%d,%d", p[0], p[1])
	}
	return strings.Join(s, " ")
}

func (l *pairList) Set(v string) error {
	var p, g int
	if _, err := fmt.Sscanf(v, "%d,%d", &p, &g); err != nil || p < 1 || g < 1 || fmt.Sprintf("%d,%d", p, g) != v {
		return fmt.Errorf("%q: want PROMPT,GEN, both ≥ 1", v)
	}
	*l = append(*l, [2]int{p, g})
	return nil
}

// wordList is a comma-separated list of words (KV cache types).
type wordList []string

func (l *wordList) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, ",")
}

func (l *wordList) Set(v string) error {
	*l = strings.Split(v, ",")
	return nil
}

// benchFlags are both modes' flags; which ones the user set decides what is allowed.
type benchFlags struct {
	fs *flag.FlagSet
	// both modes
	backend, policy string
	device          int
	threads         intList
	// the kernel suite
	kernels, withRef, quick bool
	harness                 string
	// the model benchmark
	model          string
	prompts, gens  intList
	depths, chunks intList
	pairs          pairList
	kv, ctk, ctv   wordList
	reps           int
	output         string
	noWarmup       bool
	bandwidth      bool
	machineShown   bool // the machine line is printed once per run
}

// kernelOnly and modelOnly are the flags that belong to one mode (by every name).
var (
	kernelOnly = []string{"harness", "ref", "quick"}
	modelOnly  = []string{"p", "n-prompt", "n", "n-gen", "d", "n-depth", "pg", "r", "repetitions",
		"o", "output", "chunk", "kv", "ctk", "cache-type-k", "ctv", "cache-type-v", "no-warmup", "policy", "bandwidth"}
)

func newBenchFlags(stderr io.Writer) *benchFlags {
	f := &benchFlags{fs: flag.NewFlagSet("bench", flag.ContinueOnError),
		threads: intList{2}, prompts: intList{512}, gens: intList{128}, depths: intList{0},
		chunks: intList{llm.DefaultChunk}, kv: wordList{kvcache.DefaultType.String()}}
	fs := f.fs
	fs.SetOutput(stderr)
	fs.StringVar(&f.backend, "backend", "neon", "backend name or plugin file to measure")
	fs.IntVar(&f.device, "device", 0, "device index within --backend")
	for _, n := range []string{"t", "threads"} {
		fs.Var(&f.threads, n, "threads of every contender (model: a list, 0 = the backend's default)")
	}
	fs.BoolVar(&f.kernels, "kernels", false, "the CPU kernel suite: GEMM, GEMV, read bandwidth (vs ref and OpenBLAS)")
	fs.StringVar(&f.harness, "harness", defaultHarness, `kernels: OpenBLAS harness built by "make bench-neon" ("" to leave OpenBLAS and the read bandwidth out)`)
	fs.BoolVar(&f.withRef, "ref", false, "kernels: also time core/ref on the shapes where it takes seconds, not minutes")
	fs.BoolVar(&f.quick, "quick", false, "kernels: the small shapes only")
	for _, n := range []string{"m", "model"} {
		fs.StringVar(&f.model, n, "", "GGUF model to benchmark")
	}
	for _, n := range []string{"p", "n-prompt"} {
		fs.Var(&f.prompts, n, "prompt lengths: one ppN test each, N tokens in one prefill (0 = none)")
	}
	for _, n := range []string{"n", "n-gen"} {
		fs.Var(&f.gens, n, "generation lengths: one tgN test each, N single-token decode steps (0 = none)")
	}
	for _, n := range []string{"d", "n-depth"} {
		fs.Var(&f.depths, n, "tokens already in the KV cache before each test (prefilled untimed)")
	}
	fs.Var(&f.pairs, "pg", "PROMPT,GEN: prefill then decode, timed together (repeatable)")
	for _, n := range []string{"r", "repetitions"} {
		fs.IntVar(&f.reps, n, 5, "timed repetitions of each test")
	}
	for _, n := range []string{"o", "output"} {
		fs.StringVar(&f.output, n, "md", "output format: "+strings.Join(llmbench.Formats, ", "))
	}
	fs.Var(&f.chunks, "chunk", "prefill chunk lengths")
	fs.Var(&f.kv, "kv", "KV cache dtypes of K and V together: f16, f32, q8_0, q4_0")
	for _, n := range []string{"ctk", "cache-type-k"} {
		fs.Var(&f.ctk, n, "K cache dtypes (llama-bench's -ctk; default: --kv's): every one with every V dtype")
	}
	for _, n := range []string{"ctv", "cache-type-v"} {
		fs.Var(&f.ctv, n, "V cache dtypes (llama-bench's -ctv; default: --kv's)")
	}
	fs.BoolVar(&f.noWarmup, "no-warmup", false, "skip the untimed warm-up run of each test")
	fs.BoolVar(&f.bandwidth, "bandwidth", true, "measure the machine's read bandwidth on 1 and 2 cores for the machine line on stderr (=false leaves it out)")
	fs.StringVar(&f.policy, "policy", "", "choose the device by policy instead of --backend: prefer-npu, prefer-gpu, prefer-cpu, max-performance, max-efficiency")
	setUsage(fs, stderr,
		"usage: xpu bench -m MODEL [-p 512] [-n 128] [-d 0] [-pg P,G] [-r 5] [-t 2] [-o md|json|csv] [--chunk N] [--kv f16|f32|q8_0|q4_0] [-ctk LIST] [-ctv LIST] [--backend NAME|PATH | --policy P] [--device N] [--no-warmup]",
		"       xpu bench --kernels [--backend NAME|PATH] [--device N] [--threads N] [--harness PATH] [--ref] [--quick]",
	)
	return f
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := newBenchFlags(stderr)
	if code, ok := parseFlags(f.fs, args); !ok {
		return code
	}
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "xpu bench: "+format+"\n\n", a...)
		f.fs.Usage()
		return 2
	}
	if f.fs.NArg() > 0 {
		return bad("unexpected argument %q (the model goes after -m)", f.fs.Arg(0))
	}
	if f.kernels && f.model != "" {
		return bad("-m and --kernels are two different benchmarks: give one")
	}
	if f.model == "" {
		for _, n := range modelOnly {
			if set[n] {
				return bad("-%s needs -m MODEL (the kernel suite does not take it)", n)
			}
		}
		return runKernelSuite(ctx, f, stdout, stderr)
	}
	for _, n := range kernelOnly {
		if set[n] {
			return bad("--%s belongs to the kernel suite (--kernels), not to -m", n)
		}
	}
	if set["backend"] && f.policy != "" {
		return bad("--backend and --policy both choose the device: give one")
	}
	return runModelBench(ctx, f, stdout, stderr)
}

func runKernelSuite(ctx context.Context, f *benchFlags, stdout, stderr io.Writer) int {
	if len(f.threads) != 1 || f.threads[0] < 1 {
		return usageExit(stderr, "xpu bench: --kernels takes one thread count ≥ 1, not %q", f.threads.String())
	}
	threads := f.threads[0]
	b, err := loader.Open(ctx, f.backend)
	if err != nil {
		fmt.Fprintf(stderr, "xpu bench: %v\n", err)
		return 1
	}
	defer b.Close()
	devs := b.Devices()
	if f.device < 0 || f.device >= len(devs) {
		return usageExit(stderr, "xpu bench: %s has %d device(s), no device %d", b.Info().Name, len(devs), f.device)
	}
	opts := kernelbench.Options{Threads: threads, Device: devs[f.device], Quick: f.quick}
	if f.withRef {
		opts.Ref = ref.New().Devices()[0]
	}
	if f.harness != "" {
		h, err := kernelbench.LoadHarness(f.harness)
		switch {
		case err == nil:
			opts.Harness = h
		case errors.Is(err, core.ErrNotFound):
			fmt.Fprintf(stderr, "xpu bench: no OpenBLAS harness, leaving OpenBLAS and the read bandwidth out: %v\n", err)
		default:
			fmt.Fprintf(stderr, "xpu bench: %v\n", err)
			return 1
		}
	}
	info := devs[f.device].Info()
	fmt.Fprintf(stdout, "%s (%s), %d threads\n\n", info.ID(), info.Name, threads)
	rows, err := kernelbench.Suite(ctx, opts)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tCONTENDER\tVALUE\tUNIT")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%s\n", r.Case, r.Contender, r.Value, r.Unit)
	}
	tw.Flush()
	if err != nil {
		fmt.Fprintf(stderr, "xpu bench: %v\n", err)
		return 1
	}
	return 0
}

// runModelBench measures every test on every (threads, chunk, kv) configuration, one runner per
// configuration sized for its longest test, and prints each result as it completes.
func runModelBench(ctx context.Context, f *benchFlags, stdout, stderr io.Writer) int {
	if f.reps < 1 {
		return usageExit(stderr, "xpu bench: -r %d: at least one repetition", f.reps)
	}
	w, err := llmbench.NewWriter(f.output, stdout)
	if err != nil {
		return usageExit(stderr, "xpu bench: -o: %v", err)
	}
	for _, t := range f.threads {
		if t < 0 {
			return usageExit(stderr, "xpu bench: -t %d: 0 (the backend's default) or more", t)
		}
	}
	for _, c := range f.chunks {
		if c < 1 {
			return usageExit(stderr, "xpu bench: --chunk %d: at least 1", c)
		}
	}
	kvs, err := f.kvPairs()
	if err != nil {
		return usageExit(stderr, "xpu bench: %v", err)
	}
	tests := llmbench.Tests(f.prompts, f.gens, f.pairs, f.depths)
	if len(tests) == 0 {
		return usageExit(stderr, "xpu bench: no test to run: -p, -n and -pg are all 0 or empty")
	}
	ctxLen := 0
	for _, t := range tests {
		ctxLen = max(ctxLen, t.ContextNeeded())
	}
	fail := failer(stderr, "xpu bench")
	m, err := llm.Open(f.model)
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	info := llmbench.Describe(f.model, m)
	opts := llmbench.Options{Reps: f.reps, NoWarmup: f.noWarmup}
	for _, threads := range f.threads {
		for _, chunk := range f.chunks {
			for _, kv := range kvs {
				err := benchConfig(ctx, f, m, info, threads, chunk, kv, ctxLen, tests, opts, w, stderr)
				if err != nil {
					_ = w.Flush() // what was measured before the error still prints
					return fail(err)
				}
			}
		}
	}
	if err := w.Flush(); err != nil {
		return fail(err)
	}
	return 0
}

// benchConfig prepares one runner and measures every test on it.
func benchConfig(ctx context.Context, f *benchFlags, m *llm.Model, info llmbench.ModelInfo,
	threads, chunk int, kv [2]core.DType, ctxLen int, tests []llmbench.Test, opts llmbench.Options,
	w llmbench.Writer, stderr io.Writer) error {
	ropts := []llm.RunnerOption{llm.WithChunkSize(chunk), llm.WithContextLength(ctxLen), llm.WithKVCacheTypes(kv[0], kv[1])}
	if threads > 0 {
		ropts = append(ropts, llm.WithContextOptions(map[string]string{"threads": strconv.Itoa(threads)}))
	}
	backend := f.backend
	if f.policy != "" {
		backend = ""
	}
	t0 := time.Now()
	r, backends, err := openRunner(ctx, m, backend, f.policy, f.device, backend == "ref", ropts)
	defer func() {
		for _, b := range backends {
			_ = b.Close()
		}
	}()
	if err != nil {
		return err
	}
	defer r.Close()
	di := r.Device().Info()
	dev := di.ID()
	if di.Caps.Has(core.CapEmulated) {
		dev += " (emulated)"
	}
	kb, vb := r.KVCacheBytes()
	fmt.Fprintf(stderr, "xpu bench: %s on %s, threads %s, chunk %d, kv %s/%s (%.2f MiB), context %d: prepared in %.1f s\n",
		info.Type, dev, threadsLabel(threads), r.ChunkSize(), kv[0], kv[1], mib(kb+vb), ctxLen, time.Since(t0).Seconds())
	if !f.machineShown {
		f.machineShown = true
		line, err := machineLine(ctx, di, f.bandwidth)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "xpu bench: machine: %s\n", line)
	}
	for _, t := range tests {
		start := time.Now()
		samples, err := llmbench.Measure(ctx, r, t, opts)
		if err != nil {
			return err
		}
		res := llmbench.Result{Model: info, Backend: di.Backend, Device: dev, Threads: threads,
			Chunk: r.ChunkSize(), KV: kv[0], KVV: kv[1], Test: t, Time: start, Samples: samples}
		if err := w.Write(res); err != nil {
			return err
		}
	}
	return nil
}

func threadsLabel(n int) string {
	if n == 0 {
		return "default"
	}
	return strconv.Itoa(n)
}

// kvPairs are the (K, V) cache dtypes to measure: --kv's, each for both, or with -ctk or -ctv
// every K dtype with every V dtype (the one not given defaulting to --kv's), as llama-bench.
func (f *benchFlags) kvPairs() ([][2]core.DType, error) {
	parse := func(name string, l wordList) ([]core.DType, error) {
		var out []core.DType
		for _, s := range l {
			dt, err := kvcache.ParseType(strings.TrimSpace(s))
			if err != nil {
				return nil, fmt.Errorf("--%s: %w", name, err)
			}
			out = append(out, dt)
		}
		return out, nil
	}
	both, err := parse("kv", f.kv)
	if err != nil {
		return nil, err
	}
	if len(f.ctk) == 0 && len(f.ctv) == 0 {
		var out [][2]core.DType
		for _, dt := range both {
			out = append(out, [2]core.DType{dt, dt})
		}
		return out, nil
	}
	ks, vs := both, both
	if len(f.ctk) > 0 {
		if ks, err = parse("ctk", f.ctk); err != nil {
			return nil, err
		}
	}
	if len(f.ctv) > 0 {
		if vs, err = parse("ctv", f.ctv); err != nil {
			return nil, err
		}
	}
	var out [][2]core.DType
	for _, k := range ks {
		for _, v := range vs {
			out = append(out, [2]core.DType{k, v})
		}
	}
	return out, nil
}
