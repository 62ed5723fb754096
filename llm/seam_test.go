package llm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// nopSeqHook is a SequenceHook that is never asked to serve: checkHooks refuses it first.
type nopSeqHook struct{}

func (nopSeqHook) Attach(*Seam) ([][2]sched.Span, error)               { return nil, nil }
func (nopSeqHook) Prefill(context.Context, []int32) ([]float32, error) { return nil, nil }
func (nopSeqHook) Decode(context.Context, int32) ([]float32, error)    { return nil, nil }

// nopChunkHook is a ChunkHook that is never attached: checkHooks refuses it first.
type nopChunkHook struct{}

func (nopChunkHook) Attach(context.Context, *Seam) (ChunkPrograms, error) { return nil, nil }

// TestCheckHooks: hooks and outputs that do not combine are refused with both named, and those
// that do pass.
func TestCheckHooks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   []RunnerOption
		shards bool
		want   string // "" passes
	}{
		{"nothing", nil, false, ""},
		{"decode shards and verify lengths", []RunnerOption{WithVerifyHook(chainHook{lengths: []int{4}})}, true, ""},
		{"hidden output and verify lengths", []RunnerOption{WithHiddenOutput(), WithVerifyHook(chainHook{lengths: []int{4}})}, false,
			"hidden-state output does not combine with verify lengths"},
		{"a chunk hook and verify lengths", []RunnerOption{WithChunkHook(nopChunkHook{}), WithVerifyHook(chainHook{lengths: []int{4}})}, false,
			"a chunk hook (the sparse FFN) does not combine with verify lengths"},
		{"a batch and hidden output", []RunnerOption{WithSequenceHook(nopSeqHook{}), WithHiddenOutput()}, false, "a sequence hook (a batch)"},
		{"decode shards and a chunk hook", []RunnerOption{WithChunkHook(nopChunkHook{})}, true, "decode shards does not combine with a chunk hook"},
		{"no projection hook given", []RunnerOption{WithProjectionHook(nil), WithHiddenOutput()}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := newRunnerConfig(tc.opts)
			err := cfg.checkHooks(tc.shards)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, core.ErrUnsupported)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
