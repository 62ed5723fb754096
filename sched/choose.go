package sched

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/xpuhub/xpu/core"
)

// ErrNoDevice: no device accepted the work (Choose tried every device the policy ranked).
var ErrNoDevice = errors.New("no device can run it")

// ErrNothingListed: Choose had no device to rank at all (no plugin found, nothing allowed in
// its place). An error wrapping it also wraps ErrNoDevice.
var ErrNothingListed = errors.New("no device listed")

// Choose ranks devs with p for node (the work's representative op) and hands each device, live,
// to try in turn until one accepts (try returns nil); it returns that device. open makes a
// listed device live (core.LazyDevices.Open, which opens its backend); nil when devs are live
// already. Only the devices tried are opened. The error wraps ErrNoDevice and every refusal,
// or is ctx's error.
func Choose(ctx context.Context, p Policy, node *core.Node, devs []core.Device,
	open func(context.Context, core.Device) (core.Device, error), try func(core.Device) error) (core.Device, error) {
	if p == nil {
		return nil, fmt.Errorf("sched: nil policy: %w", core.ErrInvalidArgument)
	}
	var errs []error
	for _, d := range p.Rank(node, devs) {
		live, err := d, error(nil)
		if open != nil {
			live, err = open(ctx, d)
		}
		if err == nil {
			if err = try(live); err == nil {
				return live, nil
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		errs = append(errs, fmt.Errorf("%s: %w", d.Info().ID(), err))
	}
	if len(devs) == 0 {
		errs = append(errs, ErrNothingListed)
	}
	return nil, fmt.Errorf("%w: %w", ErrNoDevice, errors.Join(errs...))
}

// ChooseFrom is Choose over the devices src lists, of which only the plugins of the devices
// tried open (core.Source.Lazy: ranking reads what the plugins last reported), and over every
// device of the backends named in extra, opened first (a fallback the caller allows, such as the
// reference backend). It returns the chosen device and the backends that hold it, which the
// caller closes; every other backend it opened is closed. A nil src lists no plugin devices.
func ChooseFrom(ctx context.Context, p Policy, node *core.Node, src core.Source, extra []string,
	try func(core.Device) error) (core.Device, []core.Backend, error) {
	var lazy core.LazyDevices = noPlugins{}
	if src != nil {
		var err error
		if lazy, err = src.Lazy(ctx); err != nil {
			return nil, nil, err
		}
	}
	devs := lazy.Devices()
	var opened []core.Backend
	for _, name := range extra {
		b, err := core.OpenBackend(ctx, src, name)
		if err != nil {
			return nil, nil, closeAll(append(lazy.Backends(), opened...), err)
		}
		opened = append(opened, b)
		devs = append(devs, b.Devices()...)
	}
	open := func(ctx context.Context, d core.Device) (core.Device, error) {
		if slices.ContainsFunc(opened, func(b core.Backend) bool { return slices.Contains(b.Devices(), d) }) {
			return d, nil
		}
		return lazy.Open(ctx, d)
	}
	d, err := Choose(ctx, p, node, devs, open, try)
	all := append(lazy.Backends(), opened...)
	if err != nil {
		return nil, nil, closeAll(all, err)
	}
	var keep []core.Backend
	for _, b := range all {
		if slices.ContainsFunc(b.Devices(), func(x core.Device) bool { return x.Info().ID() == d.Info().ID() }) {
			keep = append(keep, b)
			continue
		}
		_ = b.Close()
	}
	return d, keep, nil
}

// closeAll closes backends after err, which it returns: nothing was chosen, and what closing
// them reports adds nothing to it.
func closeAll(backends []core.Backend, err error) error {
	for _, b := range backends {
		_ = b.Close()
	}
	return err
}

// noPlugins is the device list of a program that links no plugin loader.
type noPlugins struct{}

func (noPlugins) Devices() []core.Device { return nil }
func (noPlugins) Open(_ context.Context, d core.Device) (core.Device, error) {
	return nil, fmt.Errorf("device %s: no plugin loader: %w", d.Info().ID(), core.ErrNotFound)
}
func (noPlugins) Backends() []core.Backend { return nil }
