package sched

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/sched/hostsync"
)

// maskDevice wraps a device so that every execution records the CPU mask of the thread it
// runs on, per context options' cpus value.
type maskDevice struct {
	core.Device
	mu    *sync.Mutex
	masks map[string][][]int // cpus option → masks seen
}

func (d maskDevice) NewContext(ctx context.Context, opts map[string]string) (core.Context, error) {
	c, err := d.Device.NewContext(ctx, opts)
	if err != nil {
		return nil, err
	}
	return maskContext{Context: c, d: d, key: opts["cpus"]}, nil
}

type maskContext struct {
	core.Context
	d   maskDevice
	key string
}

func (c maskContext) Prepare(ctx context.Context, g *core.Graph, opts ...core.PrepareOption) (core.Executable, error) {
	e, err := c.Context.Prepare(ctx, g, opts...)
	if err != nil {
		return nil, err
	}
	return maskExe{Executable: e, c: c}, nil
}

type maskExe struct {
	core.Executable
	c maskContext
}

func (e maskExe) NewExecution() (core.Execution, error) {
	x, err := e.Executable.NewExecution()
	if err != nil {
		return nil, err
	}
	return maskExecution{Execution: x, c: e.c}, nil
}

type maskExecution struct {
	core.Execution
	c maskContext
}

func (x maskExecution) Run(ctx context.Context) error {
	m, err := hostsync.ThreadCPUs()
	if err != nil {
		return err
	}
	x.c.d.mu.Lock()
	x.c.d.masks[x.c.key] = append(x.c.d.masks[x.c.key], m)
	x.c.d.mu.Unlock()
	return x.Execution.Run(ctx)
}

// TestRuntimePinsWorkers: a unit with a cpus option runs every task on a thread restricted to
// those CPUs (its worker pinned itself), two such units on disjoint CPUs spin on each other's
// signals, and the results are those of the unpinned runtime; a unit without the option is
// left floating.
func TestRuntimePinsWorkers(t *testing.T) {
	all, err := hostsync.ThreadCPUs()
	if err != nil {
		t.Skip(err)
	}
	if !slices.Contains(all, 0) || !slices.Contains(all, 1) {
		t.Skipf("needs CPUs 0 and 1 in the test's mask (have %v)", all)
	}
	rb := ref.New()
	defer rb.Close()
	dev := maskDevice{Device: rb.Devices()[0], mu: &sync.Mutex{}, masks: map[string][][]int{}}
	tests := []struct {
		name  string
		specs []UnitSpec
		want  map[string][]int // cpus option → the mask every run must see (nil: not pinned)
		spins bool
	}{
		{"pinned", []UnitSpec{{Backend: "ref", Options: map[string]string{"cpus": "0"}},
			{Backend: "ref", Options: map[string]string{"cpus": "1"}}}, map[string][]int{"0": {0}, "1": {1}}, true},
		{"shared-core", []UnitSpec{{Backend: "ref", Options: map[string]string{"cpus": "0-1"}},
			{Backend: "ref", Options: map[string]string{"cpus": "1"}}}, map[string][]int{"0-1": {0, 1}, "1": {1}}, false},
		{"one-floating", []UnitSpec{{Backend: "ref", Options: map[string]string{"cpus": "0"}},
			{Backend: "ref", Options: map[string]string{"threads": "1"}}}, map[string][]int{"0": {0}, "": all}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dev.mu.Lock()
			clear(dev.masks)
			dev.mu.Unlock()
			rt, err := NewRuntime(context.Background(), []core.Device{dev}, tc.specs)
			require.NoError(t, err)
			defer func() { require.NoError(t, rt.Close()) }()
			assert.Equal(t, tc.spins, rt.workers[0].spinsOn(rt.workers[1]))
			assert.Equal(t, tc.spins, rt.workers[1].spinsOn(rt.workers[0]))
			const n, rows = 64, 6
			p, x, out := twoStages(t, rt, n, rows, 2)
			writeRows(rt.Arena(), x, n, rows)
			var chunks []Chunk
			for i := range rows {
				chunks = append(chunks, Chunk{Index: i, Row: int64(i)})
			}
			require.NoError(t, p.Run(context.Background(), chunks))
			expectRows(t, rt.Arena(), x, out, n, rows)
			dev.mu.Lock()
			defer dev.mu.Unlock()
			for key, want := range tc.want {
				require.NotEmpty(t, dev.masks[key], "unit with cpus=%q ran nothing", key)
				for _, m := range dev.masks[key] {
					assert.Equal(t, want, m, "unit with cpus=%q", key)
				}
			}
		})
	}
}

// TestSpinsOn: a worker spins on another only when both are pinned and share no CPU.
func TestSpinsOn(t *testing.T) {
	tests := []struct {
		a, b []int
		want bool
	}{
		{[]int{0}, []int{1}, true},
		{[]int{0, 2}, []int{1, 3}, true},
		{[]int{0, 1}, []int{1}, false},
		{[]int{0}, nil, false},
		{nil, []int{1}, false},
		{nil, nil, false},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, (&rtWorker{cpus: tc.a}).spinsOn(&rtWorker{cpus: tc.b}), "%v on %v", tc.a, tc.b)
	}
}
