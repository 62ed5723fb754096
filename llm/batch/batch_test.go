package batch

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/llmtest"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/spec"
	"github.com/xpuhub/xpu/sched"
)

// batchPrompts differ in length (one spans several prefill chunks of 16, and of 8 while others
// decode) and answer length, so sequences join and leave the shared steps at different tokens.
var batchPrompts = []struct {
	prompt string
	tokens int
}{
	{"Once upon a time, there was a little girl named Lily.", 24},
	{"Tom had a red ball.", 9},
	{"", 30},
	{"One day, a big dog saw a cat in the park. The cat was scared and ran up a tall tree.", 16},
}

// TestBatchMatchesRunners: sequences generated at once through a Batch (batched decode steps,
// per-sequence caches and attention, prompt chunks riding in the steps) give the tokens each
// gives alone on a plain Runner, and the steps did batch several sequences and prompt chunks.
func TestBatchMatchesRunners(t *testing.T) {
	ctx := context.Background()
	m := llmtest.Stories(t)
	dev := llmtest.RefDevice(t)
	alone, err := llm.NewRunner(ctx, m, dev, llm.WithChunkSize(16), llm.WithContextLength(128))
	require.NoError(t, err)
	defer alone.Close()
	want := make([][]int32, len(batchPrompts))
	for i, p := range batchPrompts {
		alone.Reset()
		res, err := alone.Generate(ctx, p.prompt, llm.WithMaxTokens(p.tokens))
		require.NoError(t, err)
		want[i] = res.Tokens
	}

	b, err := New(ctx, m, dev, len(batchPrompts), llm.WithChunkSize(16), llm.WithContextLength(128))
	require.NoError(t, err)
	defer b.Close()
	require.Equal(t, InterleaveChunk, b.small, "prompts go in in short chunks while others decode")
	for round := range 2 { // the second round reuses the slots, their caches reset
		got := make([][]int32, len(batchPrompts))
		errs := make([]error, len(batchPrompts))
		var wg sync.WaitGroup
		for i, r := range b.Runners() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(3*i) * time.Millisecond) // join at different steps
				r.Reset()
				res, err := r.Generate(ctx, batchPrompts[i].prompt, llm.WithMaxTokens(batchPrompts[i].tokens))
				got[i], errs[i] = res.Tokens, err
			}()
		}
		wg.Wait()
		for i := range batchPrompts {
			require.NoError(t, errs[i], "round %d, sequence %d", round, i)
			assert.Equal(t, want[i], got[i], "round %d, sequence %d", round, i)
		}
	}
	st := b.Stats()
	assert.Positive(t, st.Steps)
	assert.Greater(t, float64(st.Rows)/float64(st.Steps), 1.5, "steps batch several sequences: %+v", st)
	assert.Positive(t, st.Chunks, "prompts joining decoding sequences went in while they decoded: %+v", st)
	assert.Positive(t, st.Mixed, "prompt chunks rode in decode steps: %+v", st)
	assert.LessOrEqual(t, st.Mixed, st.Chunks, "%+v", st)
	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "closing twice is a no-op")
}

// TestBatchErrors: bad arguments are errors, not panics; a decode after Close fails.
func TestBatchErrors(t *testing.T) {
	ctx := context.Background()
	m := llmtest.Stories(t)
	dev := llmtest.RefDevice(t)
	for _, tc := range []struct {
		name string
		n    int
		opts []llm.RunnerOption
		want error
	}{
		{"no sequences", 0, nil, core.ErrInvalidArgument},
		{"too many", maxBatch + 1, nil, core.ErrInvalidArgument},
		{"verify lengths", 2, []llm.RunnerOption{spec.WithVerifyLengths(4)}, core.ErrUnsupported},
		{"projection hook", 2, []llm.RunnerOption{llm.WithProjectionHook(noProjections{})}, core.ErrUnsupported},
		{"hidden-state output", 2, []llm.RunnerOption{llm.WithHiddenOutput()}, core.ErrUnsupported},
		{"bad context", 2, []llm.RunnerOption{llm.WithContextLength(-1)}, core.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(ctx, m, dev, tc.n, tc.opts...)
			require.ErrorIs(t, err, tc.want)
		})
	}
	_, err := New(ctx, nil, dev, 2)
	require.ErrorIs(t, err, core.ErrInvalidArgument)

	b, err := New(ctx, m, dev, 2, llm.WithContextLength(4), llm.WithChunkSize(2))
	require.NoError(t, err)
	r := b.Runners()[0]
	_, err = r.Decode(ctx, int32(m.Config.Vocab))
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	for range 4 {
		_, err = r.Decode(ctx, 1)
		require.NoError(t, err)
	}
	_, err = r.Decode(ctx, 1)
	require.ErrorIs(t, err, llm.ErrContextFull)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	r.Reset()
	if _, err = r.Decode(cancelled, 1); err != nil { // a step may take it before the wait sees ctx
		require.ErrorIs(t, err, context.Canceled)
	}
	require.NoError(t, b.Close())
	_, err = b.Runners()[1].Decode(ctx, 1)
	require.Error(t, err)
}

// noProjections is a projection hook that lowers no projection.
type noProjections struct{}

func (noProjections) BeginStage() llm.ProjectionBuilder { return nil }

// TestBatchOnCallersRuntime: with llm.WithRuntime the runners share the caller's runtime of one
// unit, generate what a plain runner does, and Close leaves that runtime open.
func TestBatchOnCallersRuntime(t *testing.T) {
	ctx := context.Background()
	m := llmtest.Stories(t)
	dev := llmtest.RefDevice(t)
	opts := []llm.RunnerOption{llm.WithChunkSize(16), llm.WithContextLength(64)}
	alone, err := llm.NewRunner(ctx, m, dev, opts...)
	require.NoError(t, err)
	defer alone.Close()
	want, err := alone.Generate(ctx, "Tom had a red ball.", llm.WithMaxTokens(8))
	require.NoError(t, err)

	info := dev.Info()
	rt, err := sched.NewRuntime(ctx, []core.Device{dev}, []sched.UnitSpec{{Backend: info.Backend, Index: info.Index}})
	require.NoError(t, err)
	defer func() { require.NoError(t, rt.Close()) }()
	b, err := New(ctx, m, dev, 2, append(opts, llm.WithRuntime(rt))...)
	require.NoError(t, err)
	for _, r := range b.Runners() {
		require.Same(t, rt, r.Runtime())
	}
	got, err := b.Runners()[1].Generate(ctx, "Tom had a red ball.", llm.WithMaxTokens(8))
	require.NoError(t, err)
	assert.Equal(t, want.Tokens, got.Tokens)
	require.NoError(t, b.Close())
	r, err := llm.NewRunner(ctx, m, dev, append(opts, llm.WithRuntime(rt))...)
	require.NoError(t, err, "the caller's runtime is still open after the batch's Close")
	require.NoError(t, r.Close())
}
