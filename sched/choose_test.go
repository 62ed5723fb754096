package sched_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// TestChoose: the policy's order is the order tried; a device that fails to open or refuses
// the work is passed over (and named in the error when none accepts); only the devices tried
// are opened; a cancelled ctx stops the walk.
func TestChoose(t *testing.T) {
	node := &core.Node{Op: core.OpMatMul}
	npu, gpu, cpu := newFake("qnn", core.DeviceNPU), newFake("opencl", core.DeviceGPU), newFake("neon", core.DeviceCPU)
	devs := []core.Device{cpu, gpu, npu}
	errRefused := errors.New("refused")
	for _, tc := range []struct {
		name       string
		policy     sched.Policy
		openFails  map[core.Device]bool
		refuses    map[core.Device]bool
		want       core.Device
		wantOpened []string
	}{
		{"first ranked accepts", sched.MaxPerformance, nil, nil, npu, []string{"qnn:0"}},
		{"refusal falls through", sched.MaxPerformance, nil, map[core.Device]bool{npu: true}, gpu, []string{"qnn:0", "opencl:0"}},
		{"open failure falls through", sched.PreferCPU, map[core.Device]bool{cpu: true}, nil, npu, []string{"neon:0", "qnn:0"}},
		{"none accepts", sched.MaxPerformance, nil, map[core.Device]bool{npu: true, gpu: true, cpu: true}, nil,
			[]string{"qnn:0", "opencl:0", "neon:0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opened []string
			open := func(_ context.Context, d core.Device) (core.Device, error) {
				opened = append(opened, d.Info().ID())
				if tc.openFails[d] {
					return nil, errors.New("plugin failed to open")
				}
				return d, nil
			}
			got, err := sched.Choose(context.Background(), tc.policy, node, devs, open, func(d core.Device) error {
				if tc.refuses[d] {
					return errRefused
				}
				return nil
			})
			assert.Equal(t, tc.wantOpened, opened)
			if tc.want == nil {
				require.ErrorIs(t, err, sched.ErrNoDevice)
				require.ErrorIs(t, err, errRefused)
				assert.Contains(t, err.Error(), "opencl:0")
				return
			}
			require.NoError(t, err)
			assert.Same(t, tc.want, got)
		})
	}

	_, err := sched.Choose(context.Background(), sched.MaxPerformance, node, nil, nil, func(core.Device) error { return nil })
	assert.ErrorIs(t, err, sched.ErrNoDevice, "no devices listed")
	_, err = sched.Choose(context.Background(), nil, node, devs, nil, func(core.Device) error { return nil })
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = sched.Choose(ctx, sched.MaxPerformance, node, devs, nil, func(core.Device) error { return errRefused })
	assert.ErrorIs(t, err, context.Canceled)
}
