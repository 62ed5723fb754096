package llm

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// chainHook is a VerifyHook that prepares causal verify programs of its lengths and, with
// tree, tree-masked ones: the seam as a technique sees it, without package spec.
type chainHook struct {
	lengths []int
	tree    bool
	extra   int // a length to prepare besides the hook's own (past the cache's padding: a misuse)
}

func (h chainHook) Lengths() []int { return h.lengths }

func (h chainHook) Attach(ctx context.Context, p *Seam) (any, error) {
	st := &chainState{p: p}
	lengths := h.lengths
	if h.extra > 0 {
		lengths = append(slices.Clone(lengths), h.extra)
	}
	for _, l := range lengths {
		vp, err := p.Prepare(ctx, l, h.tree)
		if err != nil {
			return nil, err
		}
		st.progs = append(st.progs, vp)
	}
	return st, nil
}

// chainState is chainHook's part of a runner.
type chainState struct {
	p     *Seam
	progs []*Program
}

// chainOf is chainHook's part of r.
func chainOf(r *Runner) *chainState { return r.Verifier().(*chainState) }

// A verify program's rows are the logits PrefillEach gives for the same tokens, causal or
// through a tree mask that is a chain; an accepted path kept by KeepRows continues as the
// tokens would.
func TestVerifyProgramRows(t *testing.T) {
	m := openStories(t)
	ctx := context.Background()
	prompt := m.Tokenizer.Encode("Tom and his dog", true)
	draft := []int32{300, 301, 302, 303, 304}
	var want [][]float32
	plain, err := NewRunner(ctx, m, refDevice(t), WithKVCacheType(core.F32))
	require.NoError(t, err)
	defer plain.Close()
	_, err = plain.PrefillEach(ctx, append(append([]int32(nil), prompt...), draft...), func(i int, l []float32) error {
		if i >= len(prompt) {
			want = append(want, append([]float32(nil), l...))
		}
		return nil
	})
	require.NoError(t, err)

	for _, tree := range []bool{false, true} {
		r, err := NewRunner(ctx, m, refDevice(t), WithKVCacheType(core.F32), WithVerifyHook(chainHook{lengths: []int{8}, tree: tree}))
		require.NoError(t, err)
		defer r.Close()
		vp := chainOf(r).progs[0]
		require.Equal(t, 8, vp.Len())
		require.Equal(t, tree, vp.Tree())
		_, err = r.Prefill(ctx, prompt)
		require.NoError(t, err)
		var pos []int32
		var mask []byte
		if tree {
			pos, mask = make([]int32, 8), make([]byte, 64)
			for i := range 8 {
				pos[i] = int32(i)
				for j := range i + 1 {
					mask[i*8+j] = 1
				}
			}
		}
		var got [][]float32
		last, err := vp.Run(ctx, draft, pos, mask, func(i int, row []byte) error {
			got = append(got, core.DecodeF32(row[:4*m.Config.Vocab]))
			return nil
		})
		require.NoError(t, err)
		assert.Equal(t, got[len(got)-1], last, "Run returns the last row")
		require.Len(t, got, len(draft))
		for i := range want {
			assert.InDeltaSlice(t, want[i], got[i], 1e-3, "tree %v, row %d", tree, i)
		}
		require.Equal(t, len(prompt)+len(draft), r.Len())
		require.NoError(t, chainOf(r).p.KeepRows(ctx, len(prompt), []int{0, 2}))
		assert.Equal(t, append(append([]int32(nil), prompt...), draft[0], draft[2]), r.Tokens(), "tree %v", tree)
	}
}

// Bad verify lengths, programs and runs are errors that change nothing.
func TestVerifyHookBadInput(t *testing.T) {
	m := openStories(t)
	ctx := context.Background()
	dev := refDevice(t)
	for name, tc := range map[string]struct {
		opts []RunnerOption
		want error
	}{
		"length 1":            {[]RunnerOption{WithVerifyHook(chainHook{lengths: []int{1}})}, core.ErrInvalidArgument},
		"length 0":            {[]RunnerOption{WithVerifyHook(chainHook{lengths: []int{4, 0}})}, core.ErrInvalidArgument},
		"past the context":    {[]RunnerOption{WithVerifyHook(chainHook{lengths: []int{128}})}, core.ErrInvalidArgument},
		"past the padding":    {[]RunnerOption{WithVerifyHook(chainHook{lengths: []int{4}, extra: 65})}, core.ErrInvalidArgument},
		"hidden-state output": {[]RunnerOption{WithVerifyHook(chainHook{lengths: []int{4}}), WithHiddenOutput()}, core.ErrUnsupported},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewRunner(ctx, m, dev, append(tc.opts, WithContextLength(64))...)
			require.ErrorIs(t, err, tc.want)
		})
	}

	r, err := NewRunner(ctx, m, dev, WithContextLength(64), WithVerifyHook(chainHook{lengths: []int{4}}))
	require.NoError(t, err)
	defer r.Close()
	vp := chainOf(r).progs[0]
	_, err = r.Prefill(ctx, make([]int32, 30))
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		run  func() error
		want error
	}{
		"more tokens than the program": {func() error { return runErr(vp.Run(ctx, make([]int32, 5), nil, nil, nil)) }, core.ErrInvalidArgument},
		"a mask for a causal program": {func() error { return runErr(vp.Run(ctx, make([]int32, 2), make([]int32, 4), make([]byte, 16), nil)) },
			core.ErrInvalidArgument},
		"a token past the vocabulary": {func() error { return runErr(vp.Run(ctx, []int32{1, int32(m.Config.Vocab)}, nil, nil, nil)) },
			core.ErrInvalidArgument},
		"keep no rows":           {func() error { return chainOf(r).p.KeepRows(ctx, 28, nil) }, core.ErrInvalidArgument},
		"keep without the first": {func() error { return chainOf(r).p.KeepRows(ctx, 28, []int{1}) }, core.ErrInvalidArgument},
		"keep past the cache":    {func() error { return chainOf(r).p.KeepRows(ctx, 28, []int{0, 2}) }, core.ErrInvalidArgument},
		"keep before row 0":      {func() error { return chainOf(r).p.KeepRows(ctx, -1, []int{0}) }, core.ErrInvalidArgument},
	} {
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, tc.run(), tc.want)
			assert.Equal(t, 30, r.Len(), "a refused call changes nothing")
		})
	}
	_, err = r.Prefill(ctx, make([]int32, 32))
	require.NoError(t, err)
	require.ErrorIs(t, runErr(vp.Run(ctx, make([]int32, 3), nil, nil, nil)), ErrContextFull)
	assert.Equal(t, 62, r.Len())
}

// runErr is a Program.Run's error.
func runErr(_ []float32, err error) error { return err }
