package sched

import (
	"context"
	"fmt"
	"maps"

	"github.com/xpuhub/xpu/core"
)

// unitDevice is a device seen as one execution unit: the device's Info, contexts opened with the
// unit's options. Sessions, executors and policies take it like any device, so a session over
// neon{cpus=0} and neon{cpus=1} places nodes on two units of one device.
type unitDevice struct {
	core.Device
	spec UnitSpec
}

// NewContext opens a context with the unit's options over opts (the unit's win).
func (u *unitDevice) NewContext(ctx context.Context, opts map[string]string) (core.Context, error) {
	merged := maps.Clone(opts)
	if merged == nil {
		merged = map[string]string{}
	}
	maps.Copy(merged, u.spec.Options)
	return u.Device.NewContext(ctx, merged)
}

// UnitDevice returns the unit spec names on dev, as a device for NewSession, NewExecutor and
// Policy: Info is dev's, contexts open with the spec's options, and reports, errors and ByName
// use the unit's name (UnitName). spec must name dev. A plain device needs no wrapping: it is
// the unit "backend:index" with no options.
func UnitDevice(dev core.Device, spec UnitSpec) (core.Device, error) {
	if dev == nil {
		return nil, fmt.Errorf("unit %s: nil device: %w", spec, core.ErrInvalidArgument)
	}
	base, _ := unitOf(dev)
	if info := base.Info(); info.Backend != spec.Backend || info.Index != spec.Index {
		return nil, fmt.Errorf("unit %s: given device %s: %w", spec, info.ID(), core.ErrInvalidArgument)
	}
	spec.Options = maps.Clone(spec.Options)
	return &unitDevice{Device: base, spec: spec}, nil
}

// UnitDevices resolves unit specs against devices (see FindDevice and UnitDevice), in order.
func UnitDevices(specs []UnitSpec, devices []core.Device) ([]core.Device, error) {
	out := make([]core.Device, 0, len(specs))
	for _, spec := range specs {
		dev, err := FindDevice(spec, devices)
		if err != nil {
			return nil, err
		}
		u, err := UnitDevice(dev, spec)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// UnitName is the name of the unit d stands for: the unit's spec text for a device from
// UnitDevice, "backend:index" for a plain device.
func UnitName(d core.Device) string {
	_, spec := unitOf(d)
	return spec.String()
}

// unitOf splits d into the device underneath and the unit spec.
func unitOf(d core.Device) (core.Device, UnitSpec) {
	if u, ok := d.(*unitDevice); ok {
		return u.Device, u.spec
	}
	info := d.Info()
	return d, UnitSpec{Backend: info.Backend, Index: info.Index}
}

// withDefaults is spec with defaults filled in for the keys it does not set.
func (u UnitSpec) withDefaults(defaults map[string]string) UnitSpec {
	if len(defaults) == 0 {
		return u
	}
	opts := maps.Clone(defaults)
	maps.Copy(opts, u.Options)
	u.Options = opts
	return u
}
