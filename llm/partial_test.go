package llm

import (
	"context"
	"fmt"
	"regexp"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/sched"
)

// addOnlyDevice is a partial backend in Go: the reference device, renamed, that answers
// op_support NO and graph_analyze NO for every op but ADD, as the skeleton of `xpu backend new`
// does. prepared counts the ADD nodes of the graphs it prepared.
type addOnlyDevice struct {
	core.Device
	prepared *atomic.Int64
}

func (d addOnlyDevice) Info() core.DeviceInfo {
	i := d.Device.Info()
	i.Backend, i.Kind = "addonly", core.DeviceAccel
	return i
}

func (d addOnlyDevice) OpSupport(q core.OpQuery) core.Verdict {
	if q.Op != core.OpAdd {
		return core.VerdictNo
	}
	return d.Device.OpSupport(q)
}

func (d addOnlyDevice) NewContext(ctx context.Context, opts map[string]string) (core.Context, error) {
	c, err := d.Device.NewContext(ctx, opts)
	if err != nil {
		return nil, err
	}
	return addOnlyContext{Context: c, dev: d}, nil
}

type addOnlyContext struct {
	core.Context
	dev addOnlyDevice
}

func (c addOnlyContext) Device() core.Device { return c.dev }

func (c addOnlyContext) Analyze(ctx context.Context, g *core.Graph) ([]core.NodeVerdict, error) {
	vs, err := c.Context.Analyze(ctx, g)
	if err != nil {
		return nil, err
	}
	for i, n := range g.Nodes {
		if n.Op != core.OpAdd {
			vs[i] = core.NodeVerdict{Reason: "runs ADD only"}
		}
	}
	return vs, nil
}

func (c addOnlyContext) Prepare(ctx context.Context, g *core.Graph, opts ...core.PrepareOption) (core.Executable, error) {
	adds := int64(0)
	for _, n := range g.Nodes {
		if n.Op != core.OpAdd {
			return nil, fmt.Errorf("node %s (%s): runs ADD only: %w", n.Name, n.Op, core.ErrUnsupported)
		}
		adds++
	}
	exe, err := c.Context.Prepare(ctx, g, opts...)
	if err == nil {
		c.dev.prepared.Add(adds)
	}
	return exe, err
}

// TestDefaultPlanRunsAPartialBackend: with no plan file, `--units addonly,ref` runs the model's
// ADDs on the partial unit and the rest on ref, and the tokens are those of ref alone. The
// default plan used to offer the partial unit only MATMULs (it is of the most matmul-oriented
// kind), all refused, so it ran nothing.
func TestDefaultPlanRunsAPartialBackend(t *testing.T) {
	m := synthModel(t, "llama", core.F32)
	refDev := ref.New().Devices()[0]
	partial := addOnlyDevice{Device: ref.New().Devices()[0], prepared: &atomic.Int64{}}
	devs := []core.Device{partial, refDev}
	ctx := context.Background()

	alone, err := NewRunner(ctx, m, refDev, WithChunkSize(8), WithContextLength(128))
	require.NoError(t, err)
	want, err := alone.Generate(ctx, storyPrompt, WithMaxTokens(6))
	require.NoError(t, err)
	require.NoError(t, alone.Close())

	specs, err := sched.ParseUnitList("addonly,ref")
	require.NoError(t, err)
	p, err := DefaultPlan(m, devs, specs)
	require.NoError(t, err)
	assert.Nil(t, p.Decode.Shards)
	r, err := NewPlannedRunner(ctx, m, devs, p, WithChunkSize(8), WithContextLength(128))
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	got, err := r.Generate(ctx, storyPrompt, WithMaxTokens(6))
	require.NoError(t, err)
	assert.Equal(t, want.Tokens, got.Tokens)

	assert.Positive(t, partial.prepared.Load(), "the partial unit prepared no ADD")
	lines := regexp.MustCompile(`(?m)^  addonly:0 +(\S+×.*)$`).FindAllStringSubmatch(r.Placement(), -1)
	require.NotEmpty(t, lines, r.Placement())
	for _, l := range lines {
		assert.Regexp(t, `^ADD×\d+$`, l[1])
	}
}
