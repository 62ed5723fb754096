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

// fakeSource lists one backend per device, opening it on first use, and counts the closes.
type fakeSource struct {
	devs   []core.Device
	opened []*fakeBackend // by Open (a lazily listed device)
	named  []*fakeBackend // by OpenBackend
}

type fakeBackend struct {
	dev    core.Device
	closed int
}

func (b *fakeBackend) Info() core.BackendInfo                        { return core.BackendInfo{Name: b.dev.Info().Backend} }
func (b *fakeBackend) Devices() []core.Device                        { return []core.Device{b.dev} }
func (b *fakeBackend) Close() error                                  { b.closed++; return nil }
func (s *fakeSource) Devices() []core.Device                         { return s.devs }
func (s *fakeSource) Backends() []core.Backend                       { return backendsOf(s.opened) }
func (s *fakeSource) Lazy(context.Context) (core.LazyDevices, error) { return s, nil }
func (s *fakeSource) OpenBackend(_ context.Context, name string) (core.Backend, error) {
	for _, d := range s.devs {
		if d.Info().Backend == name {
			b := &fakeBackend{dev: d}
			s.named = append(s.named, b)
			return b, nil
		}
	}
	return nil, core.ErrNotFound
}
func (s *fakeSource) Open(_ context.Context, d core.Device) (core.Device, error) {
	s.opened = append(s.opened, &fakeBackend{dev: d})
	return d, nil
}

func backendsOf(bs []*fakeBackend) []core.Backend {
	out := make([]core.Backend, len(bs))
	for i, b := range bs {
		out[i] = b
	}
	return out
}

// TestChooseFrom: only the devices tried open; the chosen device's backend is returned open
// and every other one opened is closed; a source listing nothing fails with ErrNothingListed;
// an extra backend that does not open fails and closes what was opened.
func TestChooseFrom(t *testing.T) {
	node := &core.Node{Op: core.OpMatMul}
	gpu, cpu := newFake("opencl", core.DeviceGPU), newFake("neon", core.DeviceCPU)
	src := &fakeSource{devs: []core.Device{cpu, gpu}}
	got, keep, err := sched.ChooseFrom(context.Background(), sched.MaxPerformance, node, src, nil, func(d core.Device) error {
		if d == gpu {
			return errors.New("refused")
		}
		return nil
	})
	require.NoError(t, err)
	assert.Same(t, cpu, got)
	require.Len(t, src.opened, 2, "the GPU tried first, then the CPU")
	assert.Equal(t, 1, src.opened[0].closed, "the refusing GPU's backend is closed")
	assert.Equal(t, 0, src.opened[1].closed, "the chosen CPU's backend stays open")
	require.Len(t, keep, 1)
	assert.Same(t, core.Backend(src.opened[1]), keep[0])

	_, _, err = sched.ChooseFrom(context.Background(), sched.MaxPerformance, node, &fakeSource{}, nil,
		func(core.Device) error { return nil })
	assert.ErrorIs(t, err, sched.ErrNothingListed)
	assert.ErrorIs(t, err, sched.ErrNoDevice)

	src = &fakeSource{devs: []core.Device{cpu}}
	_, _, err = sched.ChooseFrom(context.Background(), sched.MaxPerformance, node, src, []string{"neon", "missing"},
		func(core.Device) error { return nil })
	require.ErrorIs(t, err, core.ErrNotFound)
	require.Len(t, src.named, 1)
	assert.Equal(t, 1, src.named[0].closed, "the extra backend opened before the failure is closed")
}
