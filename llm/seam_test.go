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
	proj := WithProjectionHook(nil)
	for _, tc := range []struct {
		name   string
		opts   []RunnerOption
		shards bool
		want   string // "" passes
	}{
		{"nothing", nil, false, ""},
		{"verify lengths and taps", []RunnerOption{WithVerifyHook(chainHook{lengths: []int{4}}), WithTap(func(Tap, []byte) {})}, false, ""},
		{"decode shards and verify lengths", []RunnerOption{WithVerifyHook(chainHook{lengths: []int{4}})}, true, ""},
		{"hidden output and verify lengths", []RunnerOption{WithHiddenOutput(), WithVerifyHook(chainHook{lengths: []int{4}})}, false,
			"hidden-state output does not combine with verify lengths"},
		{"a chunk hook and taps", []RunnerOption{WithChunkHook(nopChunkHook{}), WithTap(func(Tap, []byte) {})}, false, "projection taps"},
		{"a batch and hidden output", []RunnerOption{WithSequenceHook(nopSeqHook{}), WithHiddenOutput()}, false, "a sequence hook (a batch)"},
		{"decode shards and taps", []RunnerOption{WithTap(func(Tap, []byte) {})}, true, "decode shards does not combine with projection taps"},
		{"no projection hook given", []RunnerOption{proj, WithHiddenOutput()}, false, ""},
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
