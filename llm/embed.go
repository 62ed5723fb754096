package llm

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/xpuhub/xpu/core"
)

// Pooling is how an embedding pools the final hidden states of a text's tokens: llama.cpp's
// values of the GGUF key <arch>.pooling_type.
type Pooling int

// The poolings an Embedder runs.
const (
	PoolingNone Pooling = 0 // per-token states, which no single embedding is: pooled as PoolingLast
	PoolingMean Pooling = 1 // the mean of every token's state (sentence encoders)
	PoolingCLS  Pooling = 2 // the first token's state
	PoolingLast Pooling = 3 // the last token's state: what a causal decoder's state sums up
)

// String names the pooling as llama.cpp does.
func (p Pooling) String() string {
	switch p {
	case PoolingNone:
		return "none"
	case PoolingMean:
		return "mean"
	case PoolingCLS:
		return "cls"
	case PoolingLast:
		return "last"
	}
	return fmt.Sprintf("pooling(%d)", int(p))
}

// Pooling is the pooling the model's GGUF names (<arch>.pooling_type). A model without one, or
// with none (a decoder LLM), embeds with its last token's state, the one that has seen every
// token; a value llama.cpp defines that is not a single-vector pooling (rank) is an error.
func (m *Model) Pooling() (Pooling, error) {
	if m.File == nil {
		return PoolingLast, nil
	}
	v, ok := m.File.Get(m.Config.Arch + ".pooling_type")
	if !ok {
		return PoolingLast, nil
	}
	n, isInt := v.Int()
	switch p := Pooling(n); {
	case !isInt:
		return 0, fmt.Errorf("llm: %s.pooling_type must be an integer, got %s: %w", m.Config.Arch, v.Type, core.ErrInvalidArgument)
	case p == PoolingNone:
		return PoolingLast, nil
	case p == PoolingMean || p == PoolingCLS || p == PoolingLast:
		return p, nil
	default:
		return 0, fmt.Errorf("llm: %s.pooling_type %d (mean 1, cls 2 and last 3 embed): %w", m.Config.Arch, n, core.ErrUnsupported)
	}
}

// Embedder turns texts into embeddings: the model's final-normed hidden states (the output
// head's input: no logits are computed) pooled as the model says (Model.Pooling) and scaled to
// unit length, as llama-server's /v1/embeddings does. It holds one runner, whose last stage
// outputs the hidden state; it is safe for concurrent use, the calls running one at a time.
type Embedder struct {
	mu   sync.Mutex
	r    *Runner
	pool Pooling
}

// NewEmbedder prepares an embedder on dev with NewRunner's options (W8A8 weights, a sparse FFN
// and verify lengths are not run for embeddings and are refused).
func NewEmbedder(ctx context.Context, m *Model, dev core.Device, opts ...RunnerOption) (*Embedder, error) {
	if m == nil {
		return nil, fmt.Errorf("llm: embedder: nil model: %w", core.ErrInvalidArgument)
	}
	pool, err := m.Pooling()
	if err != nil {
		return nil, err
	}
	hidden := func(c *runnerConfig) {
		c.hidden = true
	}
	check := newRunnerConfig(opts)
	if check.proj != nil || check.sparse != nil || len(check.verify) > 0 || check.tap != nil {
		return nil, fmt.Errorf("llm: embedder with a projection hook (W8A8 weights), a sparse FFN, taps or verify lengths: %w", core.ErrUnsupported)
	}
	r, err := NewRunner(ctx, m, dev, append(opts[:len(opts):len(opts)], hidden)...)
	if err != nil {
		return nil, err
	}
	return &Embedder{r: r, pool: pool}, nil
}

// NewEmbedder prepares an embedder on the engine's device with its runner options. The caller
// closes it before the engine.
func (e *Engine) NewEmbedder(ctx context.Context) (*Embedder, error) {
	return NewEmbedder(ctx, e.Model(), e.dev, e.opts...)
}

// Pooling is the pooling the embedder applies.
func (e *Embedder) Pooling() Pooling { return e.pool }

// Dim is the length of an embedding.
func (e *Embedder) Dim() int { return e.r.m.Config.Dim }

// ContextLength is the most tokens one text may have.
func (e *Embedder) ContextLength() int { return e.r.cfg.ctxLen }

// Embed returns the unit-length embedding of ids (a text encoded with its BOS, as the model
// was trained).
func (e *Embedder) Embed(ctx context.Context, ids []int32) ([]float32, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	out, err := e.pooled(ctx, ids, e.pool)
	if err != nil {
		return nil, err
	}
	unitLength(out)
	return out, nil
}

// pooled is the pooled hidden state of ids, before it is scaled to unit length.
func (e *Embedder) pooled(ctx context.Context, ids []int32, pool Pooling) ([]float32, error) {
	r := e.r
	r.Reset()
	var out []float32
	var err error
	switch pool {
	case PoolingMean, PoolingCLS:
		sum := make([]float64, r.m.Config.Dim)
		_, err = r.feed(ctx, ids, r.progs[r.cfg.chunk], func(i int, row []byte) error {
			if pool == PoolingCLS && i > 0 {
				return nil
			}
			for j, v := range core.DecodeF32(row) {
				sum[j] += float64(v)
			}
			return nil
		})
		out = make([]float32, len(sum))
		n := float64(len(ids))
		if pool == PoolingCLS {
			n = 1
		}
		for j, v := range sum {
			out[j] = float32(v / n)
		}
	default:
		out, err = r.Prefill(ctx, ids)
	}
	r.Reset()
	if err != nil {
		return nil, fmt.Errorf("llm: embed %d tokens: %w", len(ids), err)
	}
	return out, nil
}

// unitLength scales v to unit length (a zero vector stays zero).
func unitLength(v []float32) {
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	if ss == 0 {
		return
	}
	inv := 1 / math.Sqrt(ss)
	for i, x := range v {
		v[i] = float32(float64(x) * inv)
	}
}

// Close releases the embedder's runner.
func (e *Embedder) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.r.Close()
}

// head ends the last stage: the logits, or for an embedder the final-normed hidden state.
func (sb *stageBuild) head(m *Model, g *core.Graph, x *core.Tensor) {
	if sb == nil || !sb.hidden {
		m.outputHead(g, x)
		return
	}
	g.SetNamePrefix("")
	g.Output(m.norm(g, x, "output_norm.weight"))
}

// outWidth is the width of a row the last stage outputs: the vocabulary's logits, or an
// embedder's hidden state.
func (r *Runner) outWidth() int64 {
	if r.cfg.hidden {
		return int64(r.m.Config.Dim)
	}
	return int64(r.m.Config.Vocab)
}
