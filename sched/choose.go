package sched

import (
	"context"
	"errors"
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// ErrNoDevice: no device accepted the work (Choose tried every device the policy ranked).
var ErrNoDevice = errors.New("no device can run it")

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
		errs = append(errs, errors.New("no device listed"))
	}
	return nil, fmt.Errorf("%w: %w", ErrNoDevice, errors.Join(errs...))
}
