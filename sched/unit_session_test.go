package sched_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched"
)

// unit makes a unit of d from spec text, failing the test on error.
func unit(t *testing.T, d core.Device, spec string) core.Device {
	t.Helper()
	s, err := sched.ParseUnitSpec(spec)
	require.NoError(t, err)
	u, err := sched.UnitDevice(d, s)
	require.NoError(t, err)
	return u
}

func TestUnitDeviceErrors(t *testing.T) {
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	other := newFake("qnn", core.DeviceNPU, allFakeOps...)
	tests := []struct {
		name string
		dev  core.Device
		spec string
		want error
	}{
		{"nil device", nil, "neon", core.ErrInvalidArgument},
		{"another backend", other, "neon", core.ErrInvalidArgument},
		{"another index", cpu, "neon:1", core.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := sched.ParseUnitSpec(tt.spec)
			require.NoError(t, err)
			_, err = sched.UnitDevice(tt.dev, s)
			assert.ErrorIs(t, err, tt.want)
		})
	}
	specs, err := sched.ParseUnitList("neon{cpus=0},qnn:3")
	require.NoError(t, err)
	_, err = sched.UnitDevices(specs, devs(cpu, other))
	assert.ErrorIs(t, err, core.ErrNotFound)
	assert.ErrorContains(t, err, "qnn:3")
}

func TestUnitNames(t *testing.T) {
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	specs, err := sched.ParseUnitList("neon{threads=1,cpus=0},neon:0")
	require.NoError(t, err)
	units, err := sched.UnitDevices(specs, devs(cpu))
	require.NoError(t, err)
	tests := []struct {
		dev  core.Device
		want string
	}{
		{cpu, "neon:0"},
		{units[0], "neon:0{cpus=0;threads=1}"},
		{units[1], "neon:0"},
		{unit(t, units[0], "neon{threads=2}"), "neon:0{threads=2}"}, // a unit of a unit re-specs the device
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, sched.UnitName(tt.dev))
		assert.Equal(t, cpu.Info(), tt.dev.Info(), "a unit shows its device's info")
	}
}

// TestSessionOnUnits places the chain on two units of one device: two contexts with their own
// options, nodes on the unit the policy names, the report naming units.
func TestSessionOnUnits(t *testing.T) {
	tests := []struct {
		name      string
		units     []string
		policy    sched.Policy
		defaults  map[string]string
		wantUnits map[string]string // node -> unit
		wantOpen  []map[string]string
	}{
		{
			name:      "by unit name",
			units:     []string{"neon{cpus=0}", "neon{cpus=1}"},
			policy:    sched.ByName("neon:0{cpus=1}"),
			wantUnits: map[string]string{"add": "neon:0{cpus=1}", "mul": "neon:0{cpus=1}", "scale": "neon:0{cpus=1}"},
			wantOpen:  []map[string]string{{"cpus": "1"}},
		},
		{
			name:  "split across units",
			units: []string{"neon{cpus=0}", "neon{cpus=1}"},
			policy: sched.PolicyFunc("mul-on-cpu1", func(n *core.Node, ds []core.Device) []core.Device {
				if n.Op == core.OpMul {
					return ds[1:]
				}
				return ds[:1]
			}),
			wantUnits: map[string]string{"add": "neon:0{cpus=0}", "mul": "neon:0{cpus=1}", "scale": "neon:0{cpus=0}"},
			wantOpen:  []map[string]string{{"cpus": "0"}, {"cpus": "1"}},
		},
		{
			name:      "defaults fill in, the unit's options win",
			units:     []string{"neon{threads=1}"},
			policy:    sched.MaxPerformance,
			defaults:  map[string]string{"threads": "4", "int8dot": "0"},
			wantUnits: map[string]string{"add": "neon:0{int8dot=0;threads=1}", "mul": "neon:0{int8dot=0;threads=1}", "scale": "neon:0{int8dot=0;threads=1}"},
			wantOpen:  []map[string]string{{"threads": "1", "int8dot": "0"}},
		},
		{
			name:      "plain device and a unit of it",
			units:     []string{"neon", "neon{threads=2}"},
			policy:    sched.ByName("neon:0{threads=2}"),
			wantUnits: map[string]string{"add": "neon:0{threads=2}", "mul": "neon:0{threads=2}", "scale": "neon:0{threads=2}"},
			wantOpen:  []map[string]string{{"threads": "2"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
			specs, err := sched.ParseUnitList(strings.Join(tt.units, ","))
			require.NoError(t, err)
			units, err := sched.UnitDevices(specs, devs(cpu))
			require.NoError(t, err)
			opts := []sched.SessionOption{sched.WithPolicy(tt.policy), quiet}
			if tt.defaults != nil {
				opts = append(opts, sched.WithContextOptions(tt.defaults))
			}
			s, err := sched.NewSession(context.Background(), chain(t), units, opts...)
			require.NoError(t, err)
			assert.Equal(t, tt.wantUnits, devicesOf(s.Report()))
			assert.ElementsMatch(t, tt.wantOpen, cpu.liveOptions(), "one context per unit used, with its options")
			for i := range 3 {
				runChain(t, s, i)
			}
			assert.Contains(t, s.Report().String(), "UNIT")
			require.NoError(t, s.Close())
			assert.Zero(t, cpu.liveContexts.Load(), "every unit's context closed")
		})
	}
}

func TestSessionUnitErrors(t *testing.T) {
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	a, b := unit(t, cpu, "neon{cpus=0}"), unit(t, cpu, "neon{cpus=0}")
	_, err := sched.NewSession(context.Background(), chain(t), []core.Device{a, b}, quiet)
	assert.ErrorIs(t, err, core.ErrInvalidArgument, "the same unit twice")
	assert.ErrorContains(t, err, "neon:0{cpus=0} given twice")

	_, err = sched.NewSession(context.Background(), chain(t), []core.Device{a}, sched.WithPolicy(sched.ByName("neon:0{cpus=1}")), quiet)
	assert.ErrorIs(t, err, core.ErrNotFound, "a policy naming a unit that is not there")

	cpu.openErr = errors.New("no such core")
	_, err = sched.NewSession(context.Background(), chain(t), []core.Device{a}, quiet)
	assert.ErrorContains(t, err, "neon:0{cpus=0}", "the error names the unit")
}

func TestExecutorUnits(t *testing.T) {
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	e := sched.NewExecutor(quiet)
	ctx := context.Background()
	u0, err := e.Unit(ctx, unit(t, cpu, "neon{cpus=0}"))
	require.NoError(t, err)
	again, err := e.Unit(ctx, unit(t, cpu, "neon{cpus=0}"))
	require.NoError(t, err)
	assert.Same(t, u0, again, "one unit per name")
	u1, err := e.Unit(ctx, unit(t, cpu, "neon{cpus=1}"))
	require.NoError(t, err)
	assert.NotSame(t, u0, u1)
	assert.NotSame(t, u0.Context(), u1.Context(), "two units of one device: two contexts")
	assert.Equal(t, "neon:0{cpus=1}", u1.Name())
	assert.EqualValues(t, 2, cpu.liveContexts.Load())

	buf, err := e.Alloc(ctx, unit(t, cpu, "neon{cpus=1}"), 32, core.BufferDevice)
	require.NoError(t, err)
	s, err := sched.NewSession(ctx, chain(t), []core.Device{unit(t, cpu, "neon{cpus=1}")}, sched.WithExecutor(e), quiet)
	require.NoError(t, err)
	x, err := s.NewExecution()
	require.NoError(t, err)
	require.NoError(t, x.Bind(0, buf, 0), "a buffer of the unit binds")
	other, err := e.Alloc(ctx, unit(t, cpu, "neon{cpus=0}"), 32, core.BufferDevice)
	require.NoError(t, err)
	assert.ErrorContains(t, x.Bind(0, other, 0), "unit neon:0{cpus=0} is not one of the session's")
	require.NoError(t, x.Close())
	require.NoError(t, s.Close())
	require.NoError(t, buf.Close())
	require.NoError(t, other.Close())

	_, err = e.Unit(ctx, nil)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	require.NoError(t, e.Close())
	assert.Zero(t, cpu.liveContexts.Load())
}

// TestSessionOnPluginUnits runs the transformer block split across two units of each real
// plugin (one thread each, neon pinned to cores 0 and 1) against the reference.
func TestSessionOnPluginUnits(t *testing.T) {
	ctx := context.Background()
	refB := ref.New()
	defer refB.Close()
	g := block(t)
	in := blockInputs(3)
	want, err := ref.Run(ctx, g, in)
	require.NoError(t, err)

	for _, tt := range []struct {
		backend string
		units   string
		tol     float64
	}{
		{"neon", "neon{cpus=0,threads=1},neon{cpus=1,threads=1}", 1e-4},
		{"opencl", "opencl,opencl{}", 2e-2},
	} {
		t.Run(tt.backend, func(t *testing.T) {
			b, err := loader.Open(ctx, tt.backend)
			if errors.Is(err, core.ErrNotFound) {
				required.Skip(t, tt.backend, "plugin %s not built or cannot run here (run make): %v", tt.backend, err)
			}
			require.NoError(t, err)
			defer b.Close()
			specs, err := sched.ParseUnitList(tt.units)
			require.NoError(t, err)
			units, err := sched.UnitDevices(specs, b.Devices())
			if tt.backend == "opencl" {
				// "opencl" and "opencl{}" are one unit: the session refuses it twice
				require.NoError(t, err)
				_, err = sched.NewSession(ctx, g, units, quiet)
				assert.ErrorIs(t, err, core.ErrInvalidArgument)
				units = units[:1]
			}
			names := make([]string, len(units))
			for i, u := range units {
				names[i] = sched.UnitName(u)
			}
			// alternate the units node by node, so tensors cross between them
			alternate := sched.PolicyFunc("alternate", func(n *core.Node, ds []core.Device) []core.Device {
				return []core.Device{ds[n.ID%len(ds)]}
			})
			s, err := sched.NewSession(ctx, g, units, sched.WithPolicy(alternate), sched.Strict(), quiet)
			require.NoError(t, err)
			defer s.Close()
			r := s.Report()
			assert.Equal(t, names, r.Units)
			for _, n := range r.Nodes {
				assert.Contains(t, names, n.Unit)
			}
			got, err := s.Run(ctx, in)
			require.NoError(t, err)
			assert.InDeltaSlice(t, core.DecodeF32(want[0]), core.DecodeF32(got[0]), tt.tol)
		})
	}
}

// TestSessionTrace runs the chain split across two units with a trace and reads the trace
// back: one track per unit, a slice per partition run, the waits for the other unit and the
// arena copies of units that cannot import it as slices, and a slice per request.
func TestSessionTrace(t *testing.T) {
	npu := newFake("qnn", core.DeviceNPU, core.OpMul)
	cpu := newFake("neon", core.DeviceCPU, allFakeOps...)
	tr := sched.NewTrace()
	s, err := sched.NewSession(context.Background(), chain(t), []core.Device{npu, unit(t, cpu, "neon{cpus=1}")},
		sched.WithPolicy(sched.PreferNPU), sched.WithTrace(tr), quiet)
	require.NoError(t, err)
	defer s.Close()
	const runs = 3
	for i := range runs {
		runChain(t, s, i)
	}
	var buf bytes.Buffer
	require.NoError(t, tr.WriteJSON(&buf))
	var doc struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			Tid  int            `json:"tid"`
			Dur  float64        `json:"dur"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(buf.Bytes(), &doc))
	tracks := map[int]string{}
	count := map[string]int{} // "track/kind" -> slices
	for _, e := range doc.TraceEvents {
		if e.Ph == "M" && e.Name == "thread_name" {
			tracks[e.Tid] = e.Args["name"].(string)
			continue
		}
		if e.Ph != "X" {
			continue
		}
		kind := strings.Fields(e.Name)[0]
		if strings.HasPrefix(kind, "graph/p") {
			kind = "partition"
			assert.Contains(t, e.Args, "nodes")
		}
		count[tracks[e.Tid]+"/"+kind]++
		assert.GreaterOrEqual(t, e.Dur, 0.0)
		if kind == "copy" {
			assert.Positive(t, e.Args["bytes"], "a copy moves bytes")
		}
	}
	// a unit may find the other's result ready: a wait is traced only when it waits
	for _, track := range []string{"neon:0{cpus=1}", "qnn:0"} {
		assert.LessOrEqual(t, count[track+"/wait"], runs, track)
		delete(count, track+"/wait")
	}
	// chain: add (neon) → mul (qnn) → scale (neon): three partitions; the fakes cannot import
	// the arena, so each partition run copies its inputs in and its outputs out
	assert.Equal(t, map[string]int{
		"neon:0{cpus=1}/partition": 2 * runs, "qnn:0/partition": runs,
		"neon:0{cpus=1}/copy": 2 * 2 * runs, "qnn:0/copy": 2 * runs,
		"requests/session": runs,
	}, count)
}
