package llm

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/xpuhub/xpu/core"
)

// MaxVerifyLength bounds a verify length: a verify graph's logits are length × vocabulary
// floats, and drafts longer than this are not accepted whole in practice.
const MaxVerifyLength = 256

// DefaultVerifyLengths are the verify graphs a speculative runner prepares when none are given.
var DefaultVerifyLengths = []int{8, 16, 32}

// WithVerifyLengths prepares, besides the prefill and decode graphs, one static-shape graph per
// length for verifying drafts (speculative decoding): Verify runs the shortest that holds its
// tokens, padded. Each length is between 2 and MaxVerifyLength and at most the context length;
// the cache gets room for the padding of the longest.
func WithVerifyLengths(lengths ...int) RunnerOption {
	return func(c *runnerConfig) { c.verify = slices.Clone(lengths) }
}

func checkVerifyLengths(ls []int, ctxLen int) error {
	for _, l := range ls {
		if l < 2 || l > MaxVerifyLength || l > ctxLen {
			return fmt.Errorf("llm: verify length %d: must be between 2 and %d and at most the context length %d: %w",
				l, MaxVerifyLength, ctxLen, core.ErrInvalidArgument)
		}
	}
	return nil
}

// programLengths are the chunk lengths the runner prepares graphs for, ascending: decoding (1),
// the prefill chunk and the verify lengths.
func (r *Runner) programLengths() []int {
	ls := append([]int{1, r.cfg.chunk}, r.cfg.verify...)
	slices.Sort(ls)
	return slices.Compact(ls)
}

// VerifyLengths are the verify graph lengths prepared (WithVerifyLengths), ascending.
func (r *Runner) VerifyLengths() []int {
	ls := slices.Clone(r.cfg.verify)
	slices.Sort(ls)
	return slices.Compact(ls)
}

// MaxVerify is the most tokens one Verify takes: the longest verify length, 0 without any.
func (r *Runner) MaxVerify() int {
	if len(r.cfg.verify) == 0 {
		return 0
	}
	return slices.Max(r.cfg.verify)
}

// PrefillEach is Prefill that also hands f the logits after every token (i indexes tokens; the
// slice is only valid during the call): a prompt's all-position predictions, which in-context
// calibration drafts from. Chunks then run one at a time, without pipelining across units.
func (r *Runner) PrefillEach(ctx context.Context, tokens []int32, f func(i int, logits []float32) error) ([]float32, error) {
	if f == nil {
		return r.Prefill(ctx, tokens)
	}
	buf := make([]float32, r.m.Config.Vocab)
	return r.feed(ctx, tokens, r.progs[r.cfg.chunk], func(i int, row []byte) error {
		decodeF32Into(buf, row)
		return f(i, buf)
	})
}

// Verify appends tokens (the last accepted token and then a draft) in one pass of the shortest
// verify graph that holds them, and returns the logits after each of them: row i predicts the
// token after tokens[i]. The cache then holds every token given; Truncate drops a rejected
// draft's rows. More tokens than the longest verify length, or than the context has room for,
// is an error and changes nothing.
func (r *Runner) Verify(ctx context.Context, tokens []int32) ([][]float32, error) {
	if len(tokens) == 0 {
		return nil, fmt.Errorf("llm: verify of no tokens: %w", core.ErrInvalidArgument)
	}
	if len(tokens) == 1 {
		l, err := r.Decode(ctx, tokens[0])
		if err != nil {
			return nil, err
		}
		return [][]float32{l}, nil
	}
	var cp *chunkProg
	for _, l := range r.VerifyLengths() {
		if l >= len(tokens) {
			cp = r.progs[l]
			break
		}
	}
	if cp == nil {
		return nil, fmt.Errorf("llm: verify of %d tokens: the longest verify graph takes %d: %w",
			len(tokens), r.MaxVerify(), core.ErrInvalidArgument)
	}
	V := r.m.Config.Vocab
	flat := make([]float32, len(tokens)*V)
	out := make([][]float32, len(tokens))
	for i := range out {
		out[i] = flat[i*V : (i+1)*V]
	}
	_, err := r.feed(ctx, tokens, cp, func(i int, row []byte) error {
		decodeF32Into(out[i], row)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Truncate keeps the first n tokens of the cache (rollback): rows past them are overwritten by
// the next tokens fed, and until then attention never reads them.
func (r *Runner) Truncate(n int) error {
	if n < 0 || n > r.pos {
		return fmt.Errorf("llm: truncate to %d tokens: the cache holds %d: %w", n, r.pos, core.ErrInvalidArgument)
	}
	r.pos = n
	r.history = r.history[:n]
	return nil
}

// decodeF32Into decodes little-endian float32s into dst (len(src) = 4·len(dst)).
func decodeF32Into(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}
