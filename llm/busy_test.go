package llm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A runner used by a second goroutine while a call runs on it refuses with ErrBusy instead of
// mixing two sequences in one cache; the first call's text is untouched and the runner works
// again once it returns.
func TestRunnerBusyGuard(t *testing.T) {
	ctx := context.Background()
	eng, err := Load(ctx, storiesPath(t), WithBackend("ref"), WithRunnerOptions(WithContextLength(64), WithVerifyHook(chainHook{lengths: []int{4}})))
	require.NoError(t, err)
	defer eng.Close()
	want, err := eng.Generate(ctx, "Once upon a time", WithMaxTokens(8))
	require.NoError(t, err)

	calls := map[string]func() error{
		"Generate": func() error { _, err := eng.Generate(ctx, "Lily", WithMaxTokens(2)); return err },
		"GenerateUntil": func() error {
			_, err := eng.GenerateUntil(ctx, "Lily", []string{"."}, WithMaxTokens(2))
			return err
		},
		"Prefill":  func() error { _, err := eng.Prefill(ctx, []int32{1, 2}); return err },
		"Decode":   func() error { _, err := eng.Decode(ctx, 2); return err },
		"Verify":   func() error { return runErr(chainOf(eng.Runner).progs[0].Run(ctx, []int32{2, 3}, nil, nil, nil)) },
		"KeepRows": func() error { return chainOf(eng.Runner).p.KeepRows(ctx, 0, []int{0}) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			var second error
			res, err := eng.Generate(ctx, "Once upon a time", WithMaxTokens(8), WithStream(func(string) error {
				if second == nil {
					done := make(chan error)
					go func() { done <- call() }()
					second = <-done
				}
				return nil
			}))
			require.NoError(t, err)
			assert.ErrorIs(t, second, ErrBusy)
			assert.Equal(t, want.Text, res.Text, "the first call's text")
			require.NoError(t, call(), "the runner is free again after the first call")
		})
	}
}
