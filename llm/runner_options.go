package llm

import (
	"context"
	"log/slog"
	"maps"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/kvcache"
	"github.com/xpuhub/xpu/sched"
)

// DefaultChunk is the prefill chunk length when none is given.
const DefaultChunk = 64

// maxDefaultContext caps the KV cache when the caller gives no context length: models declare
// contexts (128K) whose cache would not fit a phone.
const maxDefaultContext = 4096

// DefaultContextLength is the context length a runner of m gets without WithContextLength.
func DefaultContextLength(m *Model) int { return min(m.Config.ContextLength, maxDefaultContext) }

// maxContext bounds a requested context so that cache sizes cannot overflow.
const maxContext = 1 << 24

type runnerConfig struct {
	kv kvcache.Types
	// kvSet: the caller chose the KV cache dtypes (else a backend that refuses the default
	// gets an F32 cache)
	kvSet    bool
	chunk    int
	ctxLen   int
	options  map[string]string
	progress func(done, total int)
	logger   *slog.Logger
	trace    *sched.Trace
	rt       *sched.Runtime
	// stageChecks: check every stage's outputs for NaN/Inf (WithStageChecks, debug logging).
	stageChecks bool
	// analyzeFirst: tell a prepare refusal after analysis apart (WithAnalyzeFirst).
	analyzeFirst bool
	// phaseOpts: prepare options of the CPU units per phase (WithPhaseOptions).
	phaseOpts map[sched.Phase]map[string]string
	// verifyHook prepares verify programs of the lengths verify, ascending (WithVerifyHook).
	verifyHook VerifyHook
	verify     []int
	// proj lowers the stage graphs' projections (WithProjectionHook; w8a8.WithLowering is one); nil runs the
	// projections as the model has them.
	proj ProjectionHook
	// chunkHook runs the chunks with programs of its own (WithChunkHook): the sparse FFN.
	chunkHook ChunkHook
	// seq serves Prefill and Decode over a cache it gives (WithSequenceHook): a batch.
	seq SequenceHook
	// hidden: the last stage outputs the final-normed hidden state instead of the logits
	// (an Embedder's runner, embed.go).
	hidden bool
}

// RunnerOption configures NewRunner.
type RunnerOption func(*runnerConfig)

// WithChunkSize sets the prefill chunk length (default DefaultChunk). Decoding always uses
// chunk length 1.
func WithChunkSize(n int) RunnerOption { return func(c *runnerConfig) { c.chunk = n } }

// WithKVCacheType stores the K and the V cache in dt: F16 (the default, kvcache.DefaultType),
// F32, or Q8_0 or Q4_0 (blocks of 32 along the head dimension, which must hold whole blocks),
// which halve and quarter F16's memory and the bytes attention reads per token at some cost in
// precision. Without it, a runner whose device refuses an F16 cache (a backend with no FLOAT_16
// ops) gets an F32 one.
func WithKVCacheType(dt core.DType) RunnerOption { return WithKVCacheTypes(dt, dt) }

// WithKVCacheTypes stores the K cache in k and the V cache in v (see WithKVCacheType), as
// llama.cpp's --cache-type-k and --cache-type-v: K's rounding moves every attention score, V's
// only the weighted sum, so a quantized V with an F16 K keeps more of the precision.
func WithKVCacheTypes(k, v core.DType) RunnerOption {
	return func(c *runnerConfig) { c.kv, c.kvSet = kvcache.Types{K: k, V: v}, true }
}

// WithContextLength sets the KV cache length in tokens (default: the model's, at most 4096).
func WithContextLength(n int) RunnerOption { return func(c *runnerConfig) { c.ctxLen = n } }

// WithContextOptions passes backend-specific options to Device.NewContext: NewRunner's unit
// takes them, and NewPlannedRunner's units take those their specs do not set.
func WithContextOptions(o map[string]string) RunnerOption {
	return func(c *runnerConfig) { c.options = o }
}

// WithPhaseOptions prepares the prefill programs with the prepare options prefill and the
// decode program with decode, on every CPU unit of the plan (other units get none). On the
// neon plugin these are cpus= and threads= (cputopo.NeonPhaseOptions gives them for a core
// selection, with the context options that size the pool for both): both phases' executables
// live on one context and share its weights and worker pool, so switching phase is running the
// other executable, which re-pins the workers; nothing is reallocated or repacked. A nil map
// leaves that phase on the context's own settings. A bad option (a CPU that is not online) is
// an error from NewRunner.
func WithPhaseOptions(prefill, decode map[string]string) RunnerOption {
	return func(c *runnerConfig) {
		c.phaseOpts = map[sched.Phase]map[string]string{
			sched.PhasePrefill: maps.Clone(prefill), sched.PhaseDecode: maps.Clone(decode)}
	}
}

// WithProgress reports graph preparation (which uploads the weights) as done of total stages.
func WithProgress(f func(done, total int)) RunnerOption {
	return func(c *runnerConfig) { c.progress = f }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) RunnerOption { return func(c *runnerConfig) { c.logger = l } }

// WithTrace records every partition run, cross-unit wait and copy in t: one track per unit,
// each slice with its chunk and layer (write it with t.WriteFile for Perfetto).
func WithTrace(t *sched.Trace) RunnerOption { return func(c *runnerConfig) { c.trace = t } }

// WithHiddenOutput makes the last stage output the final-normed hidden state (the output head's
// input, Config.Dim floats per token) instead of the logits: Prefill, Decode and PrefillEach
// then return hidden states, what an embedding pools (package embed). It does not combine with
// a projection hook, a sparse FFN or verify lengths (core.ErrUnsupported).
func WithHiddenOutput() RunnerOption { return func(c *runnerConfig) { c.hidden = true } }

// WithRuntime makes NewPlannedRunner run on rt's units instead of opening its own: runners
// sharing a runtime run at the same time where their plans use different units (one sequence's
// prefill on one unit while another decodes on another) and one after the other where they
// meet. The plan's units must be rt's; the runner's trace is rt's (WithTrace is ignored).
// Closing the runner releases its graphs; its cache stays in rt's arena until rt is closed.
func WithRuntime(rt *sched.Runtime) RunnerOption { return func(c *runnerConfig) { c.rt = rt } }

func newRunnerConfig(opts []RunnerOption) runnerConfig {
	cfg := runnerConfig{kv: kvcache.Types{K: kvcache.DefaultType, V: kvcache.DefaultType}, chunk: DefaultChunk, logger: slog.Default()}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.stageChecks = cfg.stageChecks || cfg.logger.Enabled(context.Background(), slog.LevelDebug)
	return cfg
}
