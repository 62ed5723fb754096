package sched_test

import (
	"context"
	"maps"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/sched"
)

// optsDevice is the reference device under another backend name whose contexts record the
// options of every Prepare.
type optsDevice struct {
	core.Device
	backend string
	mu      sync.Mutex
	seen    []map[string]string
}

func (d *optsDevice) Info() core.DeviceInfo {
	info := d.Device.Info()
	info.Backend = d.backend
	return info
}

func (d *optsDevice) NewContext(ctx context.Context, options map[string]string) (core.Context, error) {
	c, err := d.Device.NewContext(ctx, options)
	if err != nil {
		return nil, err
	}
	return &optsContext{Context: c, dev: d}, nil
}

func (d *optsDevice) prepares() []map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]map[string]string(nil), d.seen...)
}

type optsContext struct {
	core.Context
	dev *optsDevice
}

func (c *optsContext) Device() core.Device { return c.dev }

func (c *optsContext) Prepare(ctx context.Context, g *core.Graph, opts ...core.PrepareOption) (core.Executable, error) {
	cfg := core.NewPrepareConfig(opts...)
	c.dev.mu.Lock()
	c.dev.seen = append(c.dev.seen, maps.Clone(cfg.Options))
	c.dev.mu.Unlock()
	return c.Context.Prepare(ctx, g, opts...)
}

// TestProgramPrepareOptions: a program's PrepareOptions reach every Prepare of its partitions on
// the unit they name, and no other unit's; two programs on one context differ in them, and
// the same graph with the same options is prepared once.
func TestProgramPrepareOptions(t *testing.T) {
	rb := ref.New()
	defer rb.Close()
	a := &optsDevice{Device: rb.Devices()[0], backend: "reca"}
	b := &optsDevice{Device: rb.Devices()[0], backend: "recb"}
	rt, err := sched.NewRuntime(context.Background(), []core.Device{a, b},
		[]sched.UnitSpec{{Backend: "reca"}, {Backend: "recb"}})
	require.NoError(t, err)
	defer rt.Close()
	const n = 16
	x, err := rt.Arena().Alloc(n * 4)
	require.NoError(t, err)
	out, err := rt.Arena().Alloc(n * 4)
	require.NoError(t, err)
	g := core.NewGraph()
	xi := g.Input("x", core.F32, n)
	g.Output(g.Neg(g.ReLU(xi)))
	require.NoError(t, g.Err())
	compile := func(name string, opts map[int]map[string]string) *sched.Program {
		p, err := rt.Compile(context.Background(), sched.ProgramSpec{Name: name, Phase: sched.PhasePrefill,
			PrepareOptions: opts, Stages: []sched.StageSpec{{Name: "s", Graph: g, Units: []int{0, 1},
				IO: []sched.Binding{{Span: x}, {Span: out}}}}})
		require.NoError(t, err)
		return p
	}
	p1 := compile("prefill", map[int]map[string]string{0: {"cpus": "0", "threads": "1"}})
	p2 := compile("decode", map[int]map[string]string{0: {"cpus": "1"}, 1: {"threads": "2"}})
	p3 := compile("plain", nil)
	for _, p := range []*sched.Program{p1, p2, p3} {
		require.NoError(t, p.Run(context.Background(), []sched.Chunk{{}}))
	}
	require.Equal(t, []map[string]string{{"cpus": "0", "threads": "1"}, {"cpus": "1"}, nil}, a.prepares())
	// on unit 1, "plain" has the options "prefill" had (none): it takes that executable from
	// the runtime's cache instead of preparing the graph again
	require.Equal(t, []map[string]string{nil, {"threads": "2"}}, b.prepares())
}
