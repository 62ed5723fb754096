package sched

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// A partial unit (a backend that runs a few ops, not MATMUL) is offered every node outside the
// MATMUL and ATTENTION rules first, falling back to the unit the kind rules chose; the old
// default plan gave it only MATMULs, which it refuses, and so nothing at all.
func TestDefaultPlanPartial(t *testing.T) {
	type want struct {
		op           core.Op
		layer        int
		unit, fallbk int
	}
	tests := []struct {
		name    string
		units   string
		kinds   []core.DeviceKind
		partial []bool
		layers  int
		want    []want
	}{
		{"beside one CPU unit", "acme,neon", []core.DeviceKind{core.DeviceAccel, core.DeviceCPU}, []bool{true, false}, 4,
			[]want{{core.OpAdd, 1, 0, 1}, {core.OpRMSNorm, 0, 0, 1}, {core.OpMatMul, 3, 0, 1}}},
		{"listed last, beside a GPU and a CPU", "neon,opencl,acme",
			[]core.DeviceKind{core.DeviceCPU, core.DeviceGPU, core.DeviceAccel}, []bool{false, false, true}, 4,
			[]want{{core.OpMatMul, 1, 1, 0}, {core.OpAdd, 1, 2, 0}, {core.OpSiLU, 2, 2, 0}}},
		{"beside two CPU units splitting the layers", "neon{cpus=0},neon{cpus=1},acme",
			[]core.DeviceKind{core.DeviceCPU, core.DeviceCPU, core.DeviceNPU}, []bool{false, false, true}, 4,
			[]want{{core.OpAdd, 0, 2, 0}, {core.OpAdd, 3, 2, 1}, {core.OpMatMul, 3, 2, 1}}},
		{"only the first partial unit is offered nodes", "acme,neon,beta",
			[]core.DeviceKind{core.DeviceAccel, core.DeviceCPU, core.DeviceAccel}, []bool{true, false, true}, 4,
			[]want{{core.OpAdd, 1, 0, 1}}},
		{"no partial unit: the kind rules alone", "neon,opencl,qnn",
			[]core.DeviceKind{core.DeviceCPU, core.DeviceGPU, core.DeviceNPU}, []bool{false, false, false}, 4,
			[]want{{core.OpMatMul, 1, 2, 0}, {core.OpAttention, 1, 1, 0}, {core.OpAdd, 1, 0, -1}}},
		{"every unit partial: the kind rules alone", "acme,beta",
			[]core.DeviceKind{core.DeviceAccel, core.DeviceCPU}, []bool{true, true}, 4,
			[]want{{core.OpMatMul, 1, 0, 1}, {core.OpAdd, 1, 1, -1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			specs, err := ParseUnitList(tt.units)
			require.NoError(t, err)
			p := DefaultPlanPartial(specs, tt.kinds, tt.partial, tt.layers)
			require.Len(t, p.Units, len(specs), "every unit stays in the plan, in order")
			rp, err := p.Resolve()
			require.NoError(t, err)
			for _, w := range tt.want {
				for _, phase := range []Phase{PhasePrefill, PhaseDecode} {
					u, fb, err := rp.Place(phase, w.layer, node("blk.x", w.op))
					require.NoError(t, err)
					assert.Equal(t, w.unit, u, "%s %s layer %d: unit", phase, w.op, w.layer)
					assert.Equal(t, w.fallbk, fb, "%s %s layer %d: fallback", phase, w.op, w.layer)
				}
			}
		})
	}
}
