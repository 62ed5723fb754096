package ref

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"

	"github.com/xpuhub/xpu/core"
)

// Caps are the reference device's capabilities: host memory throughout, executions may overlap,
// Submit runs synchronously.
const Caps = core.CapImportHost | core.CapHostVisible | core.CapConcurrent

type backend struct {
	closed atomic.Bool
	dev    *device
}

type device struct{ b *backend }

// New returns the reference backend: one CPU device, "ref:0".
func New() core.Backend {
	b := &backend{}
	b.dev = &device{b: b}
	return b
}

func (b *backend) Info() core.BackendInfo {
	return core.BackendInfo{
		Name:    "ref",
		Vendor:  "xpu",
		Version: "1",
		// Results depend on this code and on Go's math library.
		BuildID: fmt.Sprintf("ref-opset%d-%s", core.OpsetVersion, runtime.Version()),
	}
}

func (b *backend) Devices() []core.Device { return []core.Device{b.dev} }

// Close invalidates the backend: contexts refuse new work afterwards.
func (b *backend) Close() error {
	b.closed.Store(true)
	return nil
}

func (d *device) Info() core.DeviceInfo {
	return core.DeviceInfo{
		Backend:      "ref",
		Index:        0,
		Kind:         core.DeviceCPU,
		Caps:         Caps,
		Name:         "Go float64 reference",
		Vendor:       "xpu",
		Driver:       runtime.Version(),
		ComputeUnits: 1, // one goroutine per execution
	}
}

// OpSupport is YES for every v1 op: the reference implements all of them for every dtype OPS.md
// allows (the builder rejects the rest).
func (d *device) OpSupport(q core.OpQuery) core.Verdict {
	if q.Op >= core.OpAdd && int(q.Op) <= len(core.AllOps()) {
		return core.VerdictYes
	}
	return core.VerdictNo
}

// NewContext opens a context. The reference has no options; unknown keys are logged and ignored
// so that generic option sets ("threads") can be passed to every device.
func (d *device) NewContext(ctx context.Context, options map[string]string) (core.Context, error) {
	if err := d.b.check(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("ref: new context: %w", err)
	}
	for k, v := range options {
		slog.Debug("ref: ignoring context option", "key", k, "value", v)
	}
	return &refContext{dev: d}, nil
}

func (b *backend) check() error {
	if b.closed.Load() {
		return fmt.Errorf("ref: the backend is closed: %w", core.ErrInvalidHandle)
	}
	return nil
}
