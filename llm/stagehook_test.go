package llm

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// badHook is a stage hook that builds stage graphs a runner must refuse.
type badHook struct{ stage HookStage }

func (h badHook) Stage(*Seam, int) (HookStage, error) { return h.stage, nil }

func (badHook) Bind(*Seam, int, []sched.Span, []sched.Span, map[string]sched.Binding) ([]sched.Binding, error) {
	return nil, nil
}

// badShards are decode shards of the given hooks.
type badShards struct{ hooks []StageHook }

func (s badShards) Hooks() []StageHook                  { return s.hooks }
func (badShards) Current() int                          { return 0 }
func (badShards) Observe([]time.Duration, *slog.Logger) {}

// TestStageHookRefused: a registered shard technique whose hooks give no graph, or place nodes
// on units the plan does not have, fails the runner with the reason instead of panicking.
func TestStageHookRefused(t *testing.T) {
	m := kvModel(t)
	devs := []core.Device{refDevice(t)}
	plan := mustPlan(t, `{"units":["ref{unit=a}","ref{unit=b}"],"prefill":{"rules":[{"unit":"0"}]},
		"decode":{"shards":{"units":["0","1"]},"rules":[{"unit":"0"}]}}`)
	t.Cleanup(func() { RegisterShards(nil) })
	for _, tc := range []struct {
		name  string
		hooks []StageHook
		msg   string
	}{
		{"no hook", nil, "no stage hook"},
		{"no graph", []StageHook{badHook{}}, "built no graph"},
		{"a node on a unit past the plan's", []StageHook{badHook{HookStage{Graph: core.NewGraph(), Units: map[int]int{0: 2}}}},
			"on unit 2 of 2"},
		{"pieces shared with a unit past the plan's", []StageHook{badHook{HookStage{Graph: core.NewGraph(),
			Shared: [][]int{{0}}, SharedUnits: [2]int{0, 5}}}}, "between units [0 5]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			RegisterShards(func(*Model, *sched.PlanShards) (ShardedDecode, error) { return badShards{tc.hooks}, nil })
			_, err := NewPlannedRunner(context.Background(), m, devs, plan, WithContextLength(32))
			require.ErrorIs(t, err, core.ErrInvalidArgument)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}
