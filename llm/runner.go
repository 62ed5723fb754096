package llm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/xpuhub/xpu/core"
)

// ErrContextFull: the tokens do not fit in the KV cache.
var ErrContextFull = errors.New("llm: context is full")

// DefaultChunk is the prefill chunk length when none is given.
const DefaultChunk = 64

// maxDefaultContext caps the KV cache when the caller gives no context length: models declare
// contexts (128K) whose cache would not fit a phone.
const maxDefaultContext = 4096

// maxContext bounds a requested context so that cache sizes cannot overflow.
const maxContext = 1 << 24

type runnerConfig struct {
	kv       core.DType
	chunk    int
	ctxLen   int
	options  map[string]string
	progress func(done, total int)
	logger   *slog.Logger
}

// RunnerOption configures NewRunner.
type RunnerOption func(*runnerConfig)

// WithChunkSize sets the prefill chunk length (default DefaultChunk). Decoding always uses
// chunk length 1.
func WithChunkSize(n int) RunnerOption { return func(c *runnerConfig) { c.chunk = n } }

// WithKVCacheType stores the KV cache in F32 (the default) or F16, which halves its memory and
// the bytes attention reads per token, at a small cost in precision.
func WithKVCacheType(dt core.DType) RunnerOption { return func(c *runnerConfig) { c.kv = dt } }

// WithContextLength sets the KV cache length in tokens (default: the model's, at most 4096).
func WithContextLength(n int) RunnerOption { return func(c *runnerConfig) { c.ctxLen = n } }

// WithContextOptions passes backend-specific options to Device.NewContext.
func WithContextOptions(o map[string]string) RunnerOption {
	return func(c *runnerConfig) { c.options = o }
}

// WithProgress reports graph preparation (which uploads the weights) as done of total stages.
func WithProgress(f func(done, total int)) RunnerOption {
	return func(c *runnerConfig) { c.progress = f }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) RunnerOption { return func(c *runnerConfig) { c.logger = l } }

// Runner holds one sequence's state on one device: the KV cache and the prepared stage graphs
// for the prefill chunk length and for decoding. It is not safe for concurrent use.
type Runner struct {
	m       *Model
	cfg     runnerConfig
	dev     core.Device
	bctx    core.Context
	cap     int64 // cache rows: the context plus room for a padded last chunk
	kcache  []core.Buffer
	vcache  []core.Buffer
	chunks  map[int]*chunkSet
	pos     int // tokens in the cache
	history []int32
	closers []interface{ Close() error }
}

// chunkSet is the prepared stages for one chunk length and the buffers they are bound to.
type chunkSet struct {
	c        int64
	stages   []stage // stage 0, then one per layer
	ids      core.Buffer
	pos      core.Buffer
	cos, sin core.Buffer // RoPE tables, for models with per-frequency factors
	qoff     core.Buffer
	logits   core.Buffer
	rowBytes int64 // bytes of one cache row (all kv heads)
}

// stage is one prepared stage graph and where its K/V outputs are bound (-1: none).
type stage struct {
	exec         core.Execution
	kSlot, vSlot int
}

// NewRunner opens a context on dev, allocates the KV cache and prepares the stage graphs for
// the prefill chunk length and for decoding.
func NewRunner(ctx context.Context, m *Model, dev core.Device, opts ...RunnerOption) (*Runner, error) {
	cfg := runnerConfig{kv: core.F32, chunk: DefaultChunk, logger: slog.Default()}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.ctxLen == 0 {
		cfg.ctxLen = min(m.Config.ContextLength, maxDefaultContext)
	}
	if cfg.chunk < 1 || cfg.ctxLen < 1 || cfg.ctxLen > maxContext {
		return nil, fmt.Errorf("llm: chunk %d and context %d must be positive (context at most %d): %w",
			cfg.chunk, cfg.ctxLen, maxContext, core.ErrInvalidArgument)
	}
	if cfg.kv != core.F32 && cfg.kv != core.F16 {
		return nil, fmt.Errorf("llm: KV cache type %s (f32 or f16): %w", cfg.kv, core.ErrInvalidArgument)
	}
	cfg.chunk = min(cfg.chunk, cfg.ctxLen)
	bctx, err := dev.NewContext(ctx, cfg.options)
	if err != nil {
		return nil, fmt.Errorf("llm: context on %s: %w", dev.Info().ID(), err)
	}
	r := &Runner{m: m, cfg: cfg, dev: dev, bctx: bctx, chunks: map[int]*chunkSet{},
		cap: int64(cfg.ctxLen + cfg.chunk - 1)}
	if err := r.init(ctx); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Runner) init(ctx context.Context) error {
	c := r.m.Config
	rowBytes := r.cfg.kv.Bytes(int64(c.KVHeads * c.HeadDim))
	for l := 0; l < c.Layers; l++ {
		for _, dst := range []*[]core.Buffer{&r.kcache, &r.vcache} {
			b, err := r.alloc(r.cap * rowBytes)
			if err != nil {
				return fmt.Errorf("llm: KV cache of %d rows: %w", r.cap, err)
			}
			*dst = append(*dst, b)
		}
	}
	total := 2 * (c.Layers + 1)
	if r.cfg.chunk == 1 {
		total = c.Layers + 1
	}
	done := 0
	step := func() {
		done++
		if r.cfg.progress != nil {
			r.cfg.progress(done, total)
		}
	}
	for _, n := range []int{1, r.cfg.chunk} {
		if _, ok := r.chunks[n]; ok {
			continue
		}
		t0 := time.Now()
		cs, err := r.prepare(ctx, int64(n), step)
		if err != nil {
			return err
		}
		r.chunks[n] = cs
		r.cfg.logger.Debug("llm: stage graphs prepared", "device", r.dev.Info().ID(), "chunk", n,
			"stages", len(cs.stages), "took", time.Since(t0))
	}
	return nil
}

func (r *Runner) alloc(size int64) (core.Buffer, error) {
	b, err := r.bctx.Alloc(size, core.BufferDevice)
	if err != nil {
		return nil, err
	}
	r.closers = append(r.closers, b)
	return b, nil
}

// prepare builds, prepares and binds every stage for chunk length c.
func (r *Runner) prepare(ctx context.Context, c int64, step func()) (*chunkSet, error) {
	cfg := r.m.Config
	cs := &chunkSet{c: c, rowBytes: r.cfg.kv.Bytes(int64(cfg.KVHeads * cfg.HeadDim))}
	xBytes := c * int64(cfg.Dim) * 4
	qBytes := c * int64(cfg.Heads*cfg.HeadDim) * 4
	var err error
	buf := func(size int64) core.Buffer {
		if err != nil {
			return nil
		}
		var b core.Buffer
		b, err = r.alloc(size)
		return b
	}
	cs.ids, cs.pos, cs.qoff = buf(4*c), buf(4*c), buf(4)
	if f := cfg.RopeFreqFactors; f != nil {
		cs.cos, cs.sin = buf(c*int64(len(f))*4), buf(c*int64(len(f))*4)
	}
	x := [2]core.Buffer{buf(xBytes), buf(xBytes)}
	q := [2]core.Buffer{buf(qBytes), buf(qBytes)}
	cs.logits = buf(c * int64(cfg.Vocab) * 4)
	if err != nil {
		return nil, fmt.Errorf("llm: activation buffers for chunk %d: %w", c, err)
	}
	inputs := map[string]core.Buffer{"ids": cs.ids, "pos": cs.pos, "rope_cos": cs.cos,
		"rope_sin": cs.sin, "q_offset": cs.qoff}
	for s := 0; s <= cfg.Layers; s++ {
		var g *core.Graph
		var outs []core.Buffer
		// Stage s reads the activations of the previous one from x/q[(s+1)%2] and writes the
		// other pair: ping-pong, as a stage's input and output must not alias.
		in, out := (s+1)%2, s%2
		if s == 0 {
			g, err = r.m.buildEmbedStage(c, r.cfg.kv)
		} else {
			g, err = r.m.buildLayerStage(s-1, c, r.cap, r.cfg.kv)
			inputs["x"], inputs["q"] = x[in], q[in]
			inputs["k_cache"], inputs["v_cache"] = r.kcache[s-1], r.vcache[s-1]
		}
		if err != nil {
			return nil, err
		}
		st := stage{kSlot: -1, vSlot: -1}
		if s < cfg.Layers {
			outs = []core.Buffer{x[out], q[out], nil, nil}
			st.kSlot, st.vSlot = len(g.Inputs)+outK, len(g.Inputs)+outV
		} else {
			outs = []core.Buffer{cs.logits}
		}
		st.exec, err = r.prepareStage(ctx, g, inputs, outs)
		if err != nil {
			return nil, fmt.Errorf("llm: stage %d of %d, chunk %d: %w", s, cfg.Layers, c, err)
		}
		cs.stages = append(cs.stages, st)
		step()
	}
	return cs, nil
}

// prepareStage prepares g, binds its inputs by name and its outputs in order, all at offset 0;
// nil outputs (the K/V rows) are bound per chunk.
func (r *Runner) prepareStage(ctx context.Context, g *core.Graph, inputs map[string]core.Buffer, outs []core.Buffer) (core.Execution, error) {
	exe, err := r.bctx.Prepare(ctx, g)
	if err != nil {
		return nil, err
	}
	r.closers = append(r.closers, exe)
	e, err := exe.NewExecution()
	if err != nil {
		return nil, err
	}
	r.closers = append(r.closers, e)
	if len(outs) != len(g.Outputs) {
		return nil, fmt.Errorf("llm: stage has %d outputs, %d bindings: %w", len(g.Outputs), len(outs), core.ErrInternal)
	}
	for i, t := range g.Inputs {
		b := inputs[t.Name]
		if b == nil {
			return nil, fmt.Errorf("llm: no buffer for stage input %q: %w", t.Name, core.ErrInternal)
		}
		if err := e.Bind(i, b, 0); err != nil {
			return nil, fmt.Errorf("llm: bind %s: %w", t.Name, err)
		}
	}
	for i, b := range outs {
		if b != nil {
			if err := e.Bind(len(g.Inputs)+i, b, 0); err != nil {
				return nil, fmt.Errorf("llm: bind output %s: %w", g.Outputs[i].Name, err)
			}
		}
	}
	return e, nil
}

// Close releases the cache, the prepared graphs and the context.
func (r *Runner) Close() error {
	var errs []error
	for i := len(r.closers) - 1; i >= 0; i-- {
		errs = append(errs, r.closers[i].Close())
	}
	r.closers = nil
	if r.bctx != nil {
		errs = append(errs, r.bctx.Close())
		r.bctx = nil
	}
	return errors.Join(errs...)
}

// Model is the model the runner runs.
func (r *Runner) Model() *Model { return r.m }

// Device is the device the runner runs on.
func (r *Runner) Device() core.Device { return r.dev }

// ContextLength is the most tokens the cache holds.
func (r *Runner) ContextLength() int { return r.cfg.ctxLen }

// ChunkSize is the prefill chunk length.
func (r *Runner) ChunkSize() int { return r.cfg.chunk }

// Len is the number of tokens in the cache.
func (r *Runner) Len() int { return r.pos }

// Tokens returns the tokens in the cache.
func (r *Runner) Tokens() []int32 { return append([]int32(nil), r.history...) }

// Reset empties the cache (the prepared graphs stay).
func (r *Runner) Reset() {
	r.pos = 0
	r.history = r.history[:0]
}

// Prefill appends tokens to the sequence in chunks of the prefill length, the last chunk padded
// (padding rows sit past the last real token, so the causal mask hides them), and returns the
// logits after the last token.
func (r *Runner) Prefill(ctx context.Context, tokens []int32) ([]float32, error) {
	return r.feed(ctx, tokens, r.chunks[r.cfg.chunk])
}

// Decode appends one token and returns the logits for the next.
func (r *Runner) Decode(ctx context.Context, token int32) ([]float32, error) {
	return r.feed(ctx, []int32{token}, r.chunks[1])
}

func (r *Runner) feed(ctx context.Context, tokens []int32, cs *chunkSet) ([]float32, error) {
	if len(tokens) == 0 {
		return nil, fmt.Errorf("llm: no tokens: %w", core.ErrInvalidArgument)
	}
	if r.pos+len(tokens) > r.cfg.ctxLen {
		return nil, fmt.Errorf("%w: %d tokens in the cache + %d new > context length %d",
			ErrContextFull, r.pos, len(tokens), r.cfg.ctxLen)
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= r.m.Config.Vocab {
			return nil, fmt.Errorf("llm: token %d outside the vocabulary of %d: %w", t, r.m.Config.Vocab, core.ErrInvalidArgument)
		}
	}
	var logits []float32
	for start := 0; start < len(tokens); start += int(cs.c) {
		n := min(int(cs.c), len(tokens)-start)
		set := cs
		if n == 1 {
			set = r.chunks[1] // a lone token needs no padded chunk: the decode graphs serve it
		}
		row, err := r.runChunk(ctx, set, tokens[start:start+n])
		if err != nil {
			return nil, err
		}
		if start+n == len(tokens) {
			logits = row
		}
	}
	return logits, nil
}

// runChunk runs every stage over one chunk of up to cs.c tokens and returns the logits of its
// last real token.
func (r *Runner) runChunk(ctx context.Context, cs *chunkSet, toks []int32) ([]float32, error) {
	c := int(cs.c)
	ids := make([]int32, c)
	pos := make([]int32, c)
	copy(ids, toks)
	for i := range pos {
		pos[i] = int32(r.pos + i)
	}
	if err := cs.ids.Write(0, core.EncodeI32(ids)); err != nil {
		return nil, fmt.Errorf("llm: write ids: %w", err)
	}
	if err := cs.pos.Write(0, core.EncodeI32(pos)); err != nil {
		return nil, fmt.Errorf("llm: write positions: %w", err)
	}
	if err := cs.qoff.Write(0, core.EncodeI32([]int32{int32(r.pos)})); err != nil {
		return nil, fmt.Errorf("llm: write q_offset: %w", err)
	}
	if cs.cos != nil {
		cos, sin := r.m.Config.ropeTables(pos)
		if err := cs.cos.Write(0, core.EncodeF32(cos)); err != nil {
			return nil, fmt.Errorf("llm: write RoPE table: %w", err)
		}
		if err := cs.sin.Write(0, core.EncodeF32(sin)); err != nil {
			return nil, fmt.Errorf("llm: write RoPE table: %w", err)
		}
	}
	off := int64(r.pos) * cs.rowBytes
	for s, st := range cs.stages {
		if st.kSlot >= 0 {
			// Stage s writes layer s's new K/V rows straight into the cache.
			if err := st.exec.Bind(st.kSlot, r.kcache[s], off); err != nil {
				return nil, fmt.Errorf("llm: bind K cache of layer %d: %w", s, err)
			}
			if err := st.exec.Bind(st.vSlot, r.vcache[s], off); err != nil {
				return nil, fmt.Errorf("llm: bind V cache of layer %d: %w", s, err)
			}
		}
		if err := st.exec.Run(ctx); err != nil {
			return nil, fmt.Errorf("llm: stage %d at position %d: %w", s, r.pos, err)
		}
	}
	V := int64(r.m.Config.Vocab)
	raw := make([]byte, V*4)
	if err := cs.logits.Read(int64(len(toks)-1)*V*4, raw); err != nil {
		return nil, fmt.Errorf("llm: read logits: %w", err)
	}
	r.pos += len(toks)
	r.history = append(r.history, toks...)
	return core.DecodeF32(raw), nil
}
