package loader

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/xpuhub/xpu/core"
)

// A run uses one device, yet choosing it by policy needs every device's kind and capabilities.
// Opening every plugin for that costs the start what the plugins cost: an OpenCL plugin over
// PoCL maps an LLVM, an emulated NPU its runtime, each with threads and memory, to run on the
// CPU plugin after all. Lazy ranks with what an earlier start learnt instead: each plugin's
// device list is cached beside its probe answer (keyed to the plugin file like it), and a
// plugin opens in this process only when one of its devices is used. On a cache miss (a new
// or rebuilt plugin, Rescan) the plugin is opened as OpenAll would, and its devices cached.

// deviceCachePrefix separates a plugin's device list from its probe answer in the cache.
const deviceCachePrefix = "devices\x00"

// Lazy is the devices of every usable plugin, known before the plugins open in this process.
// It is safe for concurrent use.
type Lazy struct {
	c     *config
	cands []Candidate

	mu      sync.Mutex
	devs    []core.Device
	opened  map[string]core.Backend // by plugin path
	order   []string                // opening order of opened, for Backends
	openErr map[string]error        // a plugin that failed to open: its error, not retried
	closed  bool
}

// lazyDevice stands in for a device of a plugin not opened yet: Info is what the plugin's last
// opening reported. OpSupport and NewContext open the plugin and ask the real device; Lazy.Open
// gives the real device itself.
type lazyDevice struct {
	l    *Lazy
	cd   Candidate
	info core.DeviceInfo
	pos  int // the device's position in the plugin's device list
}

func (d *lazyDevice) Info() core.DeviceInfo { return d.info }

func (d *lazyDevice) OpSupport(q core.OpQuery) core.Verdict {
	real, err := d.l.Open(context.Background(), d)
	if err != nil {
		return core.VerdictNo
	}
	return real.OpSupport(q)
}

func (d *lazyDevice) NewContext(ctx context.Context, options map[string]string) (core.Context, error) {
	real, err := d.l.Open(ctx, d)
	if err != nil {
		return nil, err
	}
	return real.NewContext(ctx, options)
}

// OpenLazy discovers plugins (Discover) and returns their devices without opening the plugins
// whose device lists an earlier opening cached; the others are opened now, as OpenAll opens
// them. A candidate that fails to open is logged and left out. The error is non-nil only when
// ctx is done. The caller closes the Lazy, which closes every plugin it opened.
func OpenLazy(ctx context.Context, opts ...Option) (*Lazy, error) {
	cands, err := Discover(ctx, opts...)
	if err != nil {
		return nil, err
	}
	l := &Lazy{c: newConfig(opts), cands: cands, opened: map[string]core.Backend{}, openErr: map[string]error{}}
	for _, cd := range cands {
		if !cd.Chosen || cd.Score <= 0 {
			continue
		}
		infos, ok := l.cachedDevices(cd.Path)
		if !ok {
			b, err := l.open(ctx, cd)
			if err != nil {
				if ctx.Err() != nil {
					return nil, errors.Join(ctx.Err(), l.Close())
				}
				logOrDefault(l.c.logger).Warn("loader: plugin failed to open", "path", cd.Path, "err", err)
				continue
			}
			for _, d := range b.Devices() {
				infos = append(infos, d.Info())
			}
			l.storeDevices(cd.Path, infos)
		}
		for i, info := range infos {
			l.devs = append(l.devs, &lazyDevice{l: l, cd: cd, info: info, pos: i})
		}
	}
	return l, nil
}

// Candidates is what discovery found, as Discover returns it.
func (l *Lazy) Candidates() []Candidate { return l.cands }

// Devices is every device of every usable plugin, in discovery order. Devices of plugins not
// opened yet are stand-ins (see Open).
func (l *Lazy) Devices() []core.Device {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]core.Device(nil), l.devs...)
}

// Open returns the real device for d, opening its plugin in this process (or isolated, as the
// options say) the first time one of its devices is asked for. A device that is not a stand-in
// of l (the reference backend's, an opened plugin's) is returned as it is.
func (l *Lazy) Open(ctx context.Context, d core.Device) (core.Device, error) {
	ld, ok := d.(*lazyDevice)
	if !ok || ld.l != l {
		return d, nil
	}
	b, err := l.open(ctx, ld.cd)
	if err != nil {
		return nil, err
	}
	devs := b.Devices()
	if ld.pos >= len(devs) || devs[ld.pos].Info().ID() != ld.info.ID() {
		// the plugin lists other devices than when its list was cached (a driver changed): the
		// cache takes the new list, so that later starts rank what is there
		infos := make([]core.DeviceInfo, 0, len(devs))
		for _, d := range devs {
			infos = append(infos, d.Info())
		}
		l.storeDevices(ld.cd.Path, infos)
		return nil, fmt.Errorf("plugin %s: device %s is gone since the plugin last listed it: %w",
			ld.cd.Path, ld.info.ID(), core.ErrNotFound)
	}
	return devs[ld.pos], nil
}

// open opens cd's plugin once; a failure is remembered.
func (l *Lazy) open(ctx context.Context, cd Candidate) (core.Backend, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("loader: %s: the device set is closed: %w", cd.Path, core.ErrBadState)
	}
	if b, ok := l.opened[cd.Path]; ok {
		return b, nil
	}
	if err, ok := l.openErr[cd.Path]; ok {
		return nil, err
	}
	b, err := openCandidate(ctx, l.c, cd)
	if err != nil {
		if ctx.Err() == nil {
			l.openErr[cd.Path] = err
		}
		return nil, err
	}
	l.opened[cd.Path] = b
	l.order = append(l.order, cd.Path)
	return b, nil
}

// Backends is the plugins opened so far, in the order they opened.
func (l *Lazy) Backends() []core.Backend {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]core.Backend, 0, len(l.order))
	for _, p := range l.order {
		out = append(out, l.opened[p])
	}
	return out
}

// Close closes every plugin l opened. Devices and contexts made from them become invalid.
func (l *Lazy) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	var errs []error
	for i := len(l.order) - 1; i >= 0; i-- {
		errs = append(errs, l.opened[l.order[i]].Close())
	}
	return errors.Join(errs...)
}

// cachedDevices is path's device list from the cache, if an opening of this very file stored
// one (and Rescan is not set).
func (l *Lazy) cachedDevices(path string) ([]core.DeviceInfo, bool) {
	dir := l.c.cacheDir()
	if dir == "" || l.c.rescan {
		return nil, false
	}
	ans, _, _, ok := cacheGet(logOrDefault(l.c.logger), dir, deviceCachePrefix+path, path)
	if !ok || len(ans.Devices) == 0 {
		return nil, false
	}
	logOrDefault(l.c.logger).Debug("loader: devices from cache", "path", path)
	return ans.Devices, true
}

func (l *Lazy) storeDevices(path string, infos []core.DeviceInfo) {
	dir := l.c.cacheDir()
	if dir == "" || len(infos) == 0 {
		return
	}
	sk := fileStat(path)
	key, err := fileKey(path)
	if err != nil {
		return
	}
	ans := probeAnswer{Opened: true, Devices: infos}
	ans.Result.Path = path
	cacheStore(logOrDefault(l.c.logger), dir, deviceCachePrefix+path, key, sk, ans)
}
