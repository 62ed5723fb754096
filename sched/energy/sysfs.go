package energy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Option configures the sysfs meters and Open.
type Option func(*config)

type config struct {
	root      string
	interval  time.Duration
	minWindow time.Duration
}

// WithRoot reads sys/class/... under root instead of "/" (fake trees in tests).
func WithRoot(root string) Option { return func(c *config) { c.root = root } }

// WithSampleInterval sets the background sampling period of the power_supply meter (default
// 50 ms, MNN-AECS's poll period).
func WithSampleInterval(d time.Duration) Option { return func(c *config) { c.interval = d } }

// WithMinWindow sets the shortest reliable window (default: 500 ms for power_supply, twice the
// 250 ms refresh of Android's battery counters; 10 ms for RAPL).
func WithMinWindow(d time.Duration) Option { return func(c *config) { c.minWindow = d } }

func newConfig(opts []Option) config {
	c := config{root: "/"}
	for _, o := range opts {
		o(&c)
	}
	return c
}

func readFloat(path string) (float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

func readText(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// PowerSupply integrates |current_now| × voltage_now of a battery, sampled in the background.
type PowerSupply struct {
	dir       string
	name      string
	interval  time.Duration
	minWindow time.Duration

	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	start   time.Time
	last    time.Time
	lastW   float64
	joules  float64
	samples int
	err     error
}

// OpenPowerSupply finds a battery under root/sys/class/power_supply with current_now and
// voltage_now and reads it once.
func OpenPowerSupply(opts ...Option) (*PowerSupply, error) {
	c := newConfig(opts)
	if c.interval <= 0 {
		c.interval = 50 * time.Millisecond
	}
	if c.minWindow <= 0 {
		c.minWindow = 500 * time.Millisecond
	}
	base := filepath.Join(c.root, "sys/class/power_supply")
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil, fmt.Errorf("%w: power_supply: %v", ErrNoMeter, err)
	}
	var tried []string
	for _, e := range ents {
		dir := filepath.Join(base, e.Name())
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if t := readText(filepath.Join(dir, "type")); t != "" && t != "Battery" {
			continue
		}
		m := &PowerSupply{dir: dir, name: "power_supply:" + e.Name(), interval: c.interval, minWindow: c.minWindow}
		if _, err := m.watts(); err != nil {
			tried = append(tried, err.Error())
			continue
		}
		return m, nil
	}
	if len(tried) == 0 {
		tried = append(tried, "no battery under "+base)
	}
	return nil, fmt.Errorf("%w: power_supply: %s", ErrNoMeter, strings.Join(tried, "; "))
}

// watts reads the battery's power now. Current is taken as a magnitude: kernels differ in the
// sign they give a discharge.
func (m *PowerSupply) watts() (float64, error) {
	i, err := readFloat(filepath.Join(m.dir, "current_now"))
	if err != nil {
		return 0, err
	}
	v, err := readFloat(filepath.Join(m.dir, "voltage_now"))
	if err != nil {
		return 0, err
	}
	w := math.Abs(i) * 1e-6 * v * 1e-6 // µA × µV
	if v <= 0 || math.IsNaN(w) || math.IsInf(w, 0) || w > maxPlausibleWatts {
		return 0, fmt.Errorf("%w: %s: current_now %g µA, voltage_now %g µV", ErrNonsense, m.name, i, v)
	}
	return w, nil
}

// Name implements Meter.
func (m *PowerSupply) Name() string { return m.name }

// Modelled implements Meter.
func (m *PowerSupply) Modelled() bool { return false }

// SampleInterval implements Meter.
func (m *PowerSupply) SampleInterval() time.Duration { return m.interval }

// MinWindow implements Meter.
func (m *PowerSupply) MinWindow() time.Duration { return m.minWindow }

// Start implements Meter: it takes a first sample and starts sampling every interval.
func (m *PowerSupply) Start(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cancel != nil {
		return ErrState
	}
	w, err := m.watts()
	if err != nil {
		return err
	}
	now := time.Now()
	m.start, m.last, m.lastW, m.joules, m.samples, m.err = now, now, w, 0, 1, nil
	sctx, cancel := context.WithCancel(ctx)
	m.cancel, m.done = cancel, make(chan struct{})
	go m.loop(sctx, m.done)
	return nil
}

func (m *PowerSupply) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
	tk := time.NewTicker(m.interval)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
			m.sample()
		}
	}
}

// sample integrates one more reading (trapezoid rule).
func (m *PowerSupply) sample() {
	w, err := m.watts()
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		if m.err == nil {
			m.err = err
		}
		return
	}
	m.joules += (w + m.lastW) / 2 * now.Sub(m.last).Seconds()
	m.last, m.lastW = now, w
	m.samples++
}

// Stop implements Meter.
func (m *PowerSupply) Stop() (Reading, error) {
	m.mu.Lock()
	cancel, done := m.cancel, m.done
	m.mu.Unlock()
	if cancel == nil {
		return Reading{Meter: m.name}, ErrState
	}
	cancel()
	<-done
	m.sample()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cancel = nil
	r := Reading{Meter: m.name, Joules: m.joules, Window: m.last.Sub(m.start), Samples: m.samples}
	if m.err != nil {
		return r, fmt.Errorf("%s: a sample failed: %w", m.name, m.err)
	}
	if r.Samples < 3 {
		return r, fmt.Errorf("%w: %s: %d samples", ErrWindowTooShort, m.name, r.Samples)
	}
	return check(r, m.minWindow)
}

// RAPL reads the package energy counters of Intel/AMD powercap (summed over packages).
type RAPL struct {
	files     []string
	ranges    []float64
	name      string
	minWindow time.Duration
	start     []float64
	t0        time.Time
	started   bool
}

// OpenRAPL finds the package domains under root/sys/class/powercap and reads them once
// (energy_uj is root-only on most kernels since 2020: that is reported as the reason).
func OpenRAPL(opts ...Option) (*RAPL, error) {
	c := newConfig(opts)
	if c.minWindow <= 0 {
		c.minWindow = 10 * time.Millisecond
	}
	base := filepath.Join(c.root, "sys/class/powercap")
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil, fmt.Errorf("%w: powercap: %v", ErrNoMeter, err)
	}
	m := &RAPL{minWindow: c.minWindow}
	var names, why []string
	for _, e := range ents {
		n := e.Name()
		// top-level zones only ("intel-rapl:0"), not subzones ("intel-rapl:0:0") or the control type
		if !strings.HasPrefix(n, "intel-rapl:") || strings.Count(n, ":") != 1 {
			continue
		}
		dir := filepath.Join(base, n)
		f := filepath.Join(dir, "energy_uj")
		if _, err := readFloat(f); err != nil {
			why = append(why, err.Error())
			continue
		}
		r, err := readFloat(filepath.Join(dir, "max_energy_range_uj"))
		if err != nil || r <= 0 {
			r = 0
		}
		m.files, m.ranges = append(m.files, f), append(m.ranges, r)
		name := readText(filepath.Join(dir, "name"))
		if name == "" {
			name = n
		}
		names = append(names, name)
	}
	if len(m.files) == 0 {
		if len(why) == 0 {
			why = append(why, "no intel-rapl zones under "+base)
		}
		return nil, fmt.Errorf("%w: powercap: %s", ErrNoMeter, strings.Join(why, "; "))
	}
	slices.Sort(names)
	m.name = "rapl:" + strings.Join(names, "+")
	return m, nil
}

// Name implements Meter.
func (m *RAPL) Name() string { return m.name }

// Modelled implements Meter.
func (m *RAPL) Modelled() bool { return false }

// SampleInterval implements Meter: the counters update about every millisecond.
func (m *RAPL) SampleInterval() time.Duration { return time.Millisecond }

// MinWindow implements Meter.
func (m *RAPL) MinWindow() time.Duration { return m.minWindow }

func (m *RAPL) read() ([]float64, error) {
	out := make([]float64, len(m.files))
	for i, f := range m.files {
		v, err := readFloat(f)
		if err != nil {
			return nil, err
		}
		if v < 0 {
			return nil, fmt.Errorf("%w: %s: %g µJ", ErrNonsense, f, v)
		}
		out[i] = v
	}
	return out, nil
}

// Start implements Meter.
func (m *RAPL) Start(context.Context) error {
	if m.started {
		return ErrState
	}
	v, err := m.read()
	if err != nil {
		return err
	}
	m.start, m.t0, m.started = v, time.Now(), true
	return nil
}

// Stop implements Meter. A counter that wrapped once is corrected with max_energy_range_uj;
// windows long enough to wrap twice are far beyond any trial.
func (m *RAPL) Stop() (Reading, error) {
	if !m.started {
		return Reading{Meter: m.name}, ErrState
	}
	m.started = false
	v, err := m.read()
	r := Reading{Meter: m.name, Window: time.Since(m.t0), Samples: 2}
	if err != nil {
		return r, err
	}
	for i := range v {
		d := v[i] - m.start[i]
		if d < 0 && m.ranges[i] > 0 {
			d += m.ranges[i]
		}
		if d < 0 {
			return r, fmt.Errorf("%w: %s went backwards by %g µJ", ErrNonsense, m.files[i], -d)
		}
		r.Joules += d * 1e-6
	}
	return check(r, m.minWindow)
}

// Open returns the first meter that can be read under the root: power_supply, then RAPL. When
// neither can, the error wraps ErrNoMeter and says why each could not.
func Open(opts ...Option) (Meter, error) {
	ps, err1 := OpenPowerSupply(opts...)
	if err1 == nil {
		return ps, nil
	}
	rp, err2 := OpenRAPL(opts...)
	if err2 == nil {
		return rp, nil
	}
	return nil, errors.Join(err1, err2)
}
