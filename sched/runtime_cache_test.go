package sched

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

// countDevice is a device whose contexts count their Prepares.
type countDevice struct {
	core.Device
	prepares *atomic.Int32
}

func (d countDevice) NewContext(ctx context.Context, options map[string]string) (core.Context, error) {
	c, err := d.Device.NewContext(ctx, options)
	if err != nil {
		return nil, err
	}
	return countContext{Context: c, dev: d}, nil
}

type countContext struct {
	core.Context
	dev countDevice
}

func (c countContext) Device() core.Device { return c.dev }

func (c countContext) Prepare(ctx context.Context, g *core.Graph, opts ...core.PrepareOption) (core.Executable, error) {
	c.dev.prepares.Add(1)
	return c.Context.Prepare(ctx, g, opts...)
}

// TestRuntimeExeCache: compiling a graph prepared before on the same unit with the same
// prepare options takes the cached executable (a program closed before still leaves it for
// the next), other options or another graph prepare anew, results stay right, and the idle
// executables beyond the cache size close.
func TestRuntimeExeCache(t *testing.T) {
	tests := []struct {
		name      string
		size      int
		wantIdle  int // cached executables after every program closed
		wantHits  int64
		wantPreps int32 // Prepares the unit's context saw
		otherOpts bool  // the second compile has other prepare options
	}{
		{name: "kept", size: DefaultCacheSize, wantIdle: 2, wantHits: 2, wantPreps: 2},
		{name: "no idle", size: 0, wantIdle: 0, wantHits: 1, wantPreps: 3},
		{name: "other options", size: DefaultCacheSize, wantIdle: 3, wantHits: 1, wantPreps: 3, otherOpts: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			rb := ref.New()
			defer rb.Close()
			dev := countDevice{Device: rb.Devices()[0], prepares: &atomic.Int32{}}
			rt, err := NewRuntime(ctx, []core.Device{dev}, []UnitSpec{{Backend: "ref"}}, WithRuntimeCacheSize(tc.size))
			require.NoError(t, err)
			defer func() { require.NoError(t, rt.Close()) }()
			graph := func(neg bool) *core.Graph {
				g := core.NewGraph()
				x := g.Input("x", core.F32, 4)
				if neg {
					g.Output(g.Neg(x))
				} else {
					g.Output(g.ReLU(x))
				}
				require.NoError(t, g.Err())
				return g
			}
			in, err := rt.Arena().Alloc(16)
			require.NoError(t, err)
			out, err := rt.Arena().Alloc(16)
			require.NoError(t, err)
			copy(rt.Arena().Bytes(in), core.EncodeF32([]float32{1, -2, 3, -4}))
			compile := func(g *core.Graph, opts map[string]string) *Program {
				spec := ProgramSpec{Name: "p", Stages: []StageSpec{{Graph: g, Units: []int{0},
					IO: []Binding{{Span: in}, {Span: out}}}}}
				if opts != nil {
					spec.PrepareOptions = map[int]map[string]string{0: opts}
				}
				p, err := rt.Compile(ctx, spec)
				require.NoError(t, err)
				return p
			}
			run := func(p *Program) []float32 {
				require.NoError(t, p.Run(ctx, []Chunk{{}}))
				return core.DecodeF32(rt.Arena().Bytes(out)[:16])
			}

			p1 := compile(graph(true), nil)
			var opts map[string]string
			if tc.otherOpts {
				opts = map[string]string{"threads": "1"}
			}
			p2 := compile(graph(true), opts) // same structure, a new graph value
			assert.Equal(t, []float32{-1, 2, -3, 4}, run(p1))
			require.NoError(t, p1.Close())
			assert.Equal(t, []float32{-1, 2, -3, 4}, run(p2), "the shared executable outlives the first program")
			p3 := compile(graph(false), nil)
			assert.Equal(t, []float32{1, 0, 3, 0}, run(p3))
			require.NoError(t, p2.Close())
			require.NoError(t, p3.Close())
			p4 := compile(graph(true), nil) // after every program closed
			assert.Equal(t, []float32{-1, 2, -3, 4}, run(p4))
			require.NoError(t, p4.Close())

			assert.Equal(t, tc.wantPreps, dev.prepares.Load(), "graphs prepared")
			n, hits := rt.exes.stats()
			assert.Equal(t, tc.wantHits, hits, "compiles that found their executable")
			assert.Equal(t, tc.wantIdle, n, "idle executables kept")
		})
	}
}
