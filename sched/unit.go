package sched

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/xpuhub/xpu/core"
)

// UnitSpec names an execution unit: a backend, a device index and context options.
//
// The text form is backend[:index][{key=value,...}], for example "neon", "qnn:0",
// "neon{cpus=0,threads=1}" or "neon:0{cpus=0,1;threads=2}". Inside the braces options are
// separated by ',' or ';'; a piece without '=' continues the previous value after a comma, so
// "cpus=0,1,threads=2" reads as cpus=0,1 and threads=2.
type UnitSpec struct {
	Backend string
	Index   int
	Options map[string]string
}

// ErrBadUnitSpec is wrapped by every unit-spec parse error (and wraps core.ErrInvalidArgument).
var ErrBadUnitSpec = fmt.Errorf("bad unit spec: %w", core.ErrInvalidArgument)

// ParseUnitSpec reads one unit spec (see UnitSpec).
func ParseUnitSpec(s string) (UnitSpec, error) {
	s = strings.TrimSpace(s)
	bad := func(why string) (UnitSpec, error) {
		return UnitSpec{}, fmt.Errorf("%w %q: %s", ErrBadUnitSpec, s, why)
	}
	head, opts := s, ""
	if i := strings.IndexByte(s, '{'); i >= 0 {
		if !strings.HasSuffix(s, "}") {
			return bad("options must end with '}'")
		}
		head, opts = s[:i], s[i+1:len(s)-1]
		if strings.ContainsAny(opts, "{}") {
			return bad("nested braces")
		}
	}
	spec := UnitSpec{Backend: head}
	if i := strings.IndexByte(head, ':'); i >= 0 {
		n, err := strconv.Atoi(head[i+1:])
		if err != nil || n < 0 {
			return bad("the device index must be a number ≥ 0")
		}
		spec.Backend, spec.Index = head[:i], n
	}
	if spec.Backend == "" || strings.ContainsAny(spec.Backend, " \t=,;") {
		return bad("no backend name")
	}
	last := ""
	for _, piece := range strings.FieldsFunc(opts, func(r rune) bool { return r == ',' || r == ';' }) {
		piece = strings.TrimSpace(piece)
		k, v, ok := strings.Cut(piece, "=")
		switch {
		case ok && k != "":
			if spec.Options == nil {
				spec.Options = map[string]string{}
			}
			if _, dup := spec.Options[k]; dup {
				return bad("option " + k + " given twice")
			}
			spec.Options[k], last = v, k
		case !ok && last != "":
			spec.Options[last] += "," + piece
		default:
			return bad("option " + strconv.Quote(piece) + " is not key=value")
		}
	}
	return spec, nil
}

// ParseUnitList reads comma-separated unit specs ("neon{cpus=0},neon{cpus=1},opencl"); commas
// inside braces belong to the options.
func ParseUnitList(s string) ([]UnitSpec, error) {
	var out []UnitSpec
	depth, start := 0, 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) {
			switch s[i] {
			case '{':
				depth++
				continue
			case '}':
				depth--
				continue
			case ',':
				if depth > 0 {
					continue
				}
			default:
				continue
			}
		}
		if part := strings.TrimSpace(s[start:i]); part != "" {
			u, err := ParseUnitSpec(part)
			if err != nil {
				return nil, err
			}
			out = append(out, u)
		}
		start = i + 1
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w %q: no units", ErrBadUnitSpec, s)
	}
	return out, nil
}

// DeviceID is the device part, "backend:index" (core.DeviceInfo.ID).
func (u UnitSpec) DeviceID() string { return fmt.Sprintf("%s:%d", u.Backend, u.Index) }

// String is the canonical text form: the device ID, then the options sorted by key.
func (u UnitSpec) String() string {
	if len(u.Options) == 0 {
		return u.DeviceID()
	}
	keys := slices.Sorted(maps.Keys(u.Options))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + u.Options[k]
	}
	return u.DeviceID() + "{" + strings.Join(parts, ";") + "}"
}

// FindDevice returns the device of devices that spec names, or an error wrapping
// core.ErrNotFound that lists the devices there are.
func FindDevice(spec UnitSpec, devices []core.Device) (core.Device, error) {
	ids := make([]string, 0, len(devices))
	for _, d := range devices {
		info := d.Info()
		if info.Backend == spec.Backend && info.Index == spec.Index {
			return d, nil
		}
		ids = append(ids, info.ID())
	}
	return nil, fmt.Errorf("unit %s: no device %s (there are: %s): %w", spec, spec.DeviceID(),
		strings.Join(ids, ", "), core.ErrNotFound)
}

// Unit is an open execution unit: a device context opened with the spec's options. It owns the
// context; everything made in it must be closed before the unit.
type Unit struct {
	spec UnitSpec
	dev  core.Device
	ctx  core.Context
}

// OpenUnit opens a context on dev with spec's options. dev must be the device spec names.
func OpenUnit(ctx context.Context, dev core.Device, spec UnitSpec) (*Unit, error) {
	if dev == nil {
		return nil, fmt.Errorf("unit %s: nil device: %w", spec, core.ErrInvalidArgument)
	}
	if info := dev.Info(); info.Backend != spec.Backend || info.Index != spec.Index {
		return nil, fmt.Errorf("unit %s: given device %s: %w", spec, info.ID(), core.ErrInvalidArgument)
	}
	c, err := dev.NewContext(ctx, maps.Clone(spec.Options))
	if err != nil {
		return nil, fmt.Errorf("unit %s: open context: %w", spec, err)
	}
	return &Unit{spec: spec, dev: dev, ctx: c}, nil
}

// Name is the unit's canonical spec text, the name plans, reports and traces use.
func (u *Unit) Name() string { return u.spec.String() }

// Spec is the unit's spec.
func (u *Unit) Spec() UnitSpec { return u.spec }

// Device is the unit's device.
func (u *Unit) Device() core.Device { return u.dev }

// Context is the unit's device context.
func (u *Unit) Context() core.Context { return u.ctx }

// Close closes the unit's context (core.ErrBadState while buffers or executables made in it
// are alive). Closing twice is a no-op.
func (u *Unit) Close() error {
	if u == nil || u.ctx == nil {
		return nil
	}
	err := u.ctx.Close()
	if !errors.Is(err, core.ErrBadState) {
		u.ctx = nil // closed, or failed for good: a retry could not succeed either
	}
	return err
}
