// Package embed turns texts into embeddings with a model's runner: its final-normed hidden
// states (llm.WithHiddenOutput) pooled as the model says and scaled to unit length, as
// llama-server's /v1/embeddings does.
package embed

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
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

// PoolingOf is the pooling m's GGUF names (<arch>.pooling_type). A model without one, or
// with none (a decoder LLM), embeds with its last token's state, the one that has seen every
// token; a value llama.cpp defines that is not a single-vector pooling (rank) is an error.
func PoolingOf(m *llm.Model) (Pooling, error) {
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
		return 0, fmt.Errorf("embed: %s.pooling_type must be an integer, got %s: %w", m.Config.Arch, v.Type, core.ErrInvalidArgument)
	case p == PoolingNone:
		return PoolingLast, nil
	case p == PoolingMean || p == PoolingCLS || p == PoolingLast:
		return p, nil
	default:
		return 0, fmt.Errorf("embed: %s.pooling_type %d (mean 1, cls 2 and last 3 embed): %w", m.Config.Arch, n, core.ErrUnsupported)
	}
}

// Embedder turns texts into embeddings: the model's final-normed hidden states (the output
// head's input: no logits are computed) pooled as the model says (Model.Pooling) and scaled to
// unit length, as llama-server's /v1/embeddings does. It holds one runner, whose last stage
// outputs the hidden state; it is safe for concurrent use, the calls running one at a time.
type Embedder struct {
	mu   sync.Mutex
	r    *llm.Runner
	pool Pooling
}

// New prepares an embedder on dev with llm.NewRunner's options (a projection hook, a sparse FFN,
// taps and verify lengths are not run for embeddings and are refused).
func New(ctx context.Context, m *llm.Model, dev core.Device, opts ...llm.RunnerOption) (*Embedder, error) {
	if m == nil {
		return nil, fmt.Errorf("embed: nil model: %w", core.ErrInvalidArgument)
	}
	pool, err := PoolingOf(m)
	if err != nil {
		return nil, err
	}
	r, err := llm.NewRunner(ctx, m, dev, append(opts[:len(opts):len(opts)], llm.WithHiddenOutput())...)
	if err != nil {
		return nil, fmt.Errorf("embed: %w", err)
	}
	return &Embedder{r: r, pool: pool}, nil
}

// FromEngine prepares an embedder on the engine's device with its runner options. The caller
// closes it before the engine.
func FromEngine(ctx context.Context, e *llm.Engine) (*Embedder, error) {
	return New(ctx, e.Model(), e.Device(), e.RunnerOptions()...)
}

// Pooling is the pooling the embedder applies.
func (e *Embedder) Pooling() Pooling { return e.pool }

// Dim is the length of an embedding.
func (e *Embedder) Dim() int { return e.r.Model().Config.Dim }

// ContextLength is the most tokens one text may have.
func (e *Embedder) ContextLength() int { return e.r.ContextLength() }

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
		sum := make([]float64, r.Model().Config.Dim)
		_, err = r.PrefillEach(ctx, ids, func(i int, row []float32) error {
			if pool == PoolingCLS && i > 0 {
				return nil
			}
			for j, v := range row {
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
		return nil, fmt.Errorf("embed: embed %d tokens: %w", len(ids), err)
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
