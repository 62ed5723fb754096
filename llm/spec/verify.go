package spec

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/draft"
)

// MaxVerifyLength bounds a verify length: a verify graph's logits are length × vocabulary
// floats, and drafts longer than this are not accepted whole in practice.
const MaxVerifyLength = 256

// DefaultVerifyLengths are the verify graphs a speculative runner prepares when none are given.
// 4 is there for the drafts that are likely but not sure to be kept: on a small model a
// verify of 4 costs about 1.3-1.5 decode passes against 2-2.4 for 8 (stories260K, neon), so
// a draft of 3 pays where one of 7 would not.
var DefaultVerifyLengths = []int{4, 8, 16, 32}

// WithVerifyLengths prepares, besides the runner's prefill and decode graphs, one static-shape
// graph per length for verifying drafts (With): Verify runs the shortest that holds its tokens,
// padded. Each length is between 2 and MaxVerifyLength and at most the context length; the cache
// gets room for the padding of the longest. The graphs take draft trees where every unit takes
// the tree mask, else chains (TreeVerify).
func WithVerifyLengths(lengths ...int) llm.RunnerOption {
	return llm.WithVerifyHook(verifyHook(slices.Clone(lengths)))
}

// verifyHook is WithVerifyLengths' llm.VerifyHook: its lengths.
type verifyHook []int

// Lengths implements llm.VerifyHook.
func (h verifyHook) Lengths() []int { return h }

// Attach implements llm.VerifyHook: it prepares the verify graphs with a tree mask where every
// unit takes it, else (a unit refuses the mask: the emulated NPU until it lowers it) for chains
// only.
func (h verifyHook) Attach(ctx context.Context, p *llm.Seam) (any, error) {
	for _, l := range h {
		if l > MaxVerifyLength {
			return nil, fmt.Errorf("spec: verify length %d: at most %d: %w", l, MaxVerifyLength, core.ErrInvalidArgument)
		}
	}
	v := &verifier{p: p, lengths: slices.Compact(slices.Sorted(slices.Values(h))), tree: true}
	err := v.prepare(ctx)
	if err != nil && errors.Is(err, core.ErrUnsupported) {
		p.Logger().Debug("llm: verify graphs without a tree mask", "err", err)
		v.tree = false
		for _, vp := range v.progs {
			if err := vp.Close(); err != nil {
				return nil, err
			}
		}
		v.progs = v.progs[:0]
		err = v.prepare(ctx)
	}
	if err != nil {
		return nil, err
	}
	return v, nil
}

// verifier is a runner's verify graphs, one per length.
type verifier struct {
	p       *llm.Seam
	lengths []int // ascending
	progs   []*llm.Program
	tree    bool // the graphs take a tree mask (else they verify chains, with the causal mask)
}

func (v *verifier) prepare(ctx context.Context) error {
	for _, n := range v.lengths {
		vp, err := v.p.Prepare(ctx, n, v.tree)
		if err != nil {
			return err
		}
		v.progs = append(v.progs, vp)
	}
	return nil
}

// verifierOf is r's verify graphs, nil without any.
func verifierOf(r *llm.Runner) *verifier {
	v, _ := r.Verifier().(*verifier)
	return v
}

// VerifyLengths are r's verify graph lengths (WithVerifyLengths), ascending.
func VerifyLengths(r *llm.Runner) []int {
	if v := verifierOf(r); v != nil {
		return slices.Clone(v.lengths)
	}
	return nil
}

// MaxVerify is the most tokens one Verify on r takes: the longest verify length, 0 without any.
func MaxVerify(r *llm.Runner) int {
	if v := verifierOf(r); v != nil && len(v.lengths) > 0 {
		return v.lengths[len(v.lengths)-1]
	}
	return 0
}

// TreeVerify says r's verify graphs take draft trees (VerifyTree); without, they take chains.
func TreeVerify(r *llm.Runner) bool {
	v := verifierOf(r)
	return v != nil && v.tree && len(v.progs) > 0
}

// Verify appends tokens (the last accepted token and then a draft) to r's cache in one pass of
// the shortest verify graph that holds them, and returns the logits after each of them: row i
// predicts the token after tokens[i]. The cache then holds every token given; r.Truncate drops
// a rejected draft's rows. More tokens than the longest verify length, or than the context has
// room for, is an error and changes nothing.
func Verify(ctx context.Context, r *llm.Runner, tokens []int32) ([][]float32, error) {
	if len(tokens) == 0 {
		return nil, fmt.Errorf("spec: verify of no tokens: %w", core.ErrInvalidArgument)
	}
	if len(tokens) == 1 {
		l, err := r.Decode(ctx, tokens[0])
		if err != nil {
			return nil, err
		}
		return [][]float32{l}, nil
	}
	return VerifyTree(ctx, r, tokens[0], draft.Chain(tokens[1:]))
}

// VerifyTree appends root (the last accepted token) and the draft tree's nodes to r's cache in
// one pass of the shortest verify graph that holds them, each node seeing its ancestors only (a
// tree mask) and placed at the position of its depth, and returns the logits after root (row 0)
// and after each node (row i+1). The cache then holds root and the nodes in tree order: KeepPath
// keeps an accepted path. A tree that is not a chain needs TreeVerify; an invalid tree, more
// nodes than the longest verify graph takes or than the context has room for is an error and
// changes nothing.
func VerifyTree(ctx context.Context, r *llm.Runner, root int32, tree draft.Tree) ([][]float32, error) {
	return VerifyTreeInto(ctx, r, root, tree, nil)
}

// VerifyTreeInto is VerifyTree with the logits written into buf when it holds them (a
// speculative loop's rows live for one step: a fresh n × vocabulary slice per verify was a
// sixth of the Go side's time of a verify pass on a small model).
func VerifyTreeInto(ctx context.Context, r *llm.Runner, root int32, tree draft.Tree, buf []float32) ([][]float32, error) {
	n := tree.Len() + 1
	var vp *llm.Program
	if v := verifierOf(r); v != nil {
		for i, l := range v.lengths {
			if l >= n {
				vp = v.progs[i]
				break
			}
		}
	}
	if vp == nil {
		return nil, fmt.Errorf("spec: verify of %d tokens: the longest verify graph takes %d: %w",
			n, MaxVerify(r), core.ErrInvalidArgument)
	}
	V := r.Model().Config.Vocab
	if err := tree.Validate(V, n-1); err != nil {
		return nil, fmt.Errorf("spec: %w: %w", err, core.ErrInvalidArgument)
	}
	chain := true
	for i, p := range tree.Parents {
		chain = chain && p == i-1
	}
	if !chain && !vp.Tree() {
		return nil, fmt.Errorf("spec: the verify graphs take chains only (a unit refuses the tree mask): %w", core.ErrUnsupported)
	}
	var pos []int32
	var mask []byte
	if vp.Tree() {
		pos, mask = treeInputs(vp.Len(), tree)
	}
	flat := buf
	if len(flat) < n*V {
		flat = make([]float32, n*V)
	}
	out := make([][]float32, n)
	for i := range out {
		out[i] = flat[i*V : (i+1)*V]
	}
	_, err := vp.Run(ctx, append([]int32{root}, tree.Tokens...), pos, mask, func(i int, row []byte) error {
		core.DecodeF32To(out[i], row[:4*len(out[i])])
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// treeInputs are a tree verify's positions (as offsets from the cache length: root at 0, a node
// one past its parent) and mask (row i: its ancestors and itself; a padding row sees itself
// only) for a graph of length c.
func treeInputs(c int, tree draft.Tree) ([]int32, []byte) {
	pos := make([]int32, c)
	mask := make([]byte, c*c)
	mask[0] = 1
	for i, p := range tree.Parents {
		row := i + 1
		pos[row] = pos[p+1] + 1
		copy(mask[row*c:row*c+c], mask[(p+1)*c:(p+1)*c+c])
		mask[row*c+row] = 1
	}
	for row := tree.Len() + 1; row < c; row++ {
		pos[row] = int32(row)
		mask[row*c+row] = 1
	}
	return pos, mask
}

// KeepPath keeps, of the rows a VerifyTree wrote to r's cache from row base on, those at keep
// (tree rows, ascending from 0 = the root: an accepted path), moved to rows base, base+1, ... on
// every unit (sched.Runtime.CompactKV), and drops the rest.
func KeepPath(ctx context.Context, r *llm.Runner, base int, keep []int) error {
	v := verifierOf(r)
	if v == nil {
		return fmt.Errorf("%w: %w", ErrNoVerifyGraphs, core.ErrInvalidArgument)
	}
	return v.p.KeepRows(ctx, base, keep)
}
