package loader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/core"
)

// openIsolated starts a plugin host for cd and presents it as a core.Backend.
func openIsolated(ctx context.Context, cfg *config, cd Candidate) (core.Backend, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b := &isoBackend{cfg: cfg, cd: cd}
	if err := b.start(ctx); err != nil {
		return nil, err
	}
	return b, nil
}

type isoBackend struct {
	cfg *config
	cd  Candidate

	mu       sync.Mutex
	proc     *isoProc
	calls    *isoCalls // proc's function table, under the one core.Backend adapter (abi.NewDevice)
	info     core.BackendInfo
	devs     []core.Device
	restarts int
	closed   bool
}

func (b *isoBackend) start(ctx context.Context) error {
	pr, err := startProc(b.cfg, b.cd)
	if err != nil {
		return err
	}
	resp, err := pr.call(ctx, "get_info", &rpcReq{Op: opInfo})
	if err != nil {
		// the plugin host answers get_info with the reason it could not open the plugin
		if se := (*abi.StatusError)(nil); errors.As(err, &se) {
			err = fmt.Errorf("isolated %s: the plugin host could not open the plugin: %s: %w", b.cd.Name,
				se.Msg, se.Status.Sentinel())
		}
		pr.kill(err)
		pr.release()
		return err
	}
	var info isoInfo
	if err := json.Unmarshal(resp.B, &info); err != nil {
		pr.kill(err)
		pr.release()
		return fmt.Errorf("isolated %s: bad info from the plugin host: %v: %w", b.cd.Name, err, core.ErrInternal)
	}
	if err := pr.attachRing(ctx); err != nil {
		pr.kill(err)
		pr.release()
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.proc = pr
	b.info = core.BackendInfo{Name: info.Probe.Name, Vendor: info.Info.Vendor,
		Version: info.Info.Version, BuildID: info.Info.BuildID, SDKVersion: info.Info.SDKVersion,
		Path: b.cd.Path, Score: info.Probe.Score, Isolated: true}
	b.calls = newIsoCalls(pr, b.cfg, b.cd)
	b.devs = b.devs[:0]
	devs := make([]core.DeviceInfo, len(info.Devices))
	for i, d := range info.Devices {
		// host memory of this process cannot be shared with the child (so the adapter copies
		// constants into shared memory instead of importing them); fds and mapped (shared)
		// buffers can
		d.Caps = d.Caps&^core.CapImportHost | core.CapImportFD | core.CapHostVisible
		devs[i] = d
	}
	calls := b.currentCalls
	if b.cfg.validate {
		calls = abi.Validated(calls, info.Probe.Name, devs)
	}
	for i, d := range devs {
		b.devs = append(b.devs, abi.NewDevice(calls, uint32(i), d))
	}
	return nil
}

func (b *isoBackend) current() (*isoProc, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("isolated %s: backend is closed: %w", b.cd.Name, core.ErrBadState)
	}
	return b.proc, nil
}

// currentCalls is the devices' source of Calls: those of the current child.
func (b *isoBackend) currentCalls() (abi.Calls, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("isolated %s: backend is closed: %w", b.cd.Name, core.ErrBadState)
	}
	return b.calls, nil
}

func (b *isoBackend) Info() core.BackendInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.info
}

func (b *isoBackend) Devices() []core.Device {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]core.Device(nil), b.devs...)
}

func (b *isoBackend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	pr := b.proc
	b.mu.Unlock()
	return pr.close()
}

// Restart kills the current child (if alive) and starts a new one.
func (b *isoBackend) Restart(ctx context.Context) error {
	pr, err := b.current()
	if err != nil {
		return err
	}
	pr.kill(fmt.Errorf("isolated %s: the backend was restarted: %w", b.cd.Name, core.ErrBackendCrashed))
	pr.release()
	if err := b.start(ctx); err != nil {
		return err
	}
	b.mu.Lock()
	b.restarts++
	b.mu.Unlock()
	return nil
}
