package energy

import (
	"context"
	"fmt"
	"time"
)

// Model is a model-based meter: joules = Power() × the window, or, for a CPU-time model, a
// function of the window and the process CPU time spent in it. Its readings are Modelled.
type Model struct {
	name   string
	energy func(wall, cpu time.Duration) float64
	cpu    func() (time.Duration, error)
	min    time.Duration

	t0      time.Time
	c0      time.Duration
	started bool
}

// NewModel is a meter that charges watts() for every second of the window (watts is read at
// Stop, so a simulation can set the power of what ran). name should say what the model is.
func NewModel(name string, watts func() float64) *Model {
	return &Model{name: "model:" + name, energy: func(wall, _ time.Duration) float64 {
		return watts() * wall.Seconds()
	}}
}

// NewCPUTimeModel is a meter for a machine with nothing to read: idleW for every second of the
// window plus coreW for every CPU-second this process used in it (getrusage). The constants
// are assumptions, and the name carries them.
func NewCPUTimeModel(idleW, coreW float64) *Model {
	return &Model{
		name: fmt.Sprintf("model:cpu-time(%.2g W + %.2g W per busy core)", idleW, coreW),
		energy: func(wall, cpu time.Duration) float64 {
			return idleW*wall.Seconds() + coreW*cpu.Seconds()
		},
		cpu: ProcessCPUTime,
	}
}

// Name implements Meter.
func (m *Model) Name() string { return m.name }

// Modelled implements Meter: always true.
func (m *Model) Modelled() bool { return true }

// SampleInterval implements Meter: a model has nothing to sample; 0.
func (m *Model) SampleInterval() time.Duration { return 0 }

// MinWindow implements Meter: getrusage counts in scheduler ticks, so a CPU-time model needs
// a few of them; a pure power model any positive window.
func (m *Model) MinWindow() time.Duration {
	if m.cpu != nil {
		return 50 * time.Millisecond
	}
	return time.Nanosecond
}

// Start implements Meter.
func (m *Model) Start(context.Context) error {
	if m.started {
		return ErrState
	}
	if m.cpu != nil {
		c, err := m.cpu()
		if err != nil {
			return err
		}
		m.c0 = c
	}
	m.t0, m.started = time.Now(), true
	return nil
}

// Stop implements Meter.
func (m *Model) Stop() (Reading, error) {
	if !m.started {
		return Reading{Meter: m.name, Modelled: true}, ErrState
	}
	m.started = false
	wall := time.Since(m.t0)
	var cpu time.Duration
	if m.cpu != nil {
		c, err := m.cpu()
		if err != nil {
			return Reading{Meter: m.name, Modelled: true}, err
		}
		cpu = c - m.c0
	}
	r := Reading{Meter: m.name, Joules: m.energy(wall, cpu), Window: wall, Modelled: true}
	return check(r, m.MinWindow())
}

// Fallback measures with primary and, when primary's reading fails (nonsense, a window it
// cannot resolve, a failed sample), answers with fallback's reading of the same window instead,
// flagged Modelled when fallback is, with the reason in Note and passed to announce (once per
// failure). Start errors of primary fall back the same way.
type Fallback struct {
	primary, fallback Meter
	announce          func(string)
	primaryOn         bool
	startNote         string
}

// NewFallback wraps primary with fallback; announce (may be nil) hears every fallback.
func NewFallback(primary, fallback Meter, announce func(string)) *Fallback {
	if announce == nil {
		announce = func(string) {}
	}
	return &Fallback{primary: primary, fallback: fallback, announce: announce}
}

// Name implements Meter: the primary's name, with the fallback's after it.
func (f *Fallback) Name() string { return f.primary.Name() + " (fallback " + f.fallback.Name() + ")" }

// Modelled implements Meter: whether the primary is modelled; each Reading says what it is.
func (f *Fallback) Modelled() bool { return f.primary.Modelled() }

// SampleInterval implements Meter.
func (f *Fallback) SampleInterval() time.Duration { return f.primary.SampleInterval() }

// MinWindow implements Meter.
func (f *Fallback) MinWindow() time.Duration {
	return max(f.primary.MinWindow(), f.fallback.MinWindow())
}

// Start implements Meter.
func (f *Fallback) Start(ctx context.Context) error {
	if err := f.fallback.Start(ctx); err != nil {
		return err
	}
	f.startNote = ""
	f.primaryOn = true
	if err := f.primary.Start(ctx); err != nil {
		f.primaryOn = false
		f.startNote = fmt.Sprintf("%s failed to start (%v): using %s", f.primary.Name(), err, f.fallback.Name())
		f.announce(f.startNote)
	}
	return nil
}

// Stop implements Meter.
func (f *Fallback) Stop() (Reading, error) {
	var perr error
	var pr Reading
	if f.primaryOn {
		pr, perr = f.primary.Stop()
		f.primaryOn = false
	}
	fr, ferr := f.fallback.Stop()
	if f.startNote == "" && perr == nil {
		return pr, nil
	}
	if ferr != nil {
		return fr, fmt.Errorf("%s: %w; fallback %s: %w", f.primary.Name(), perr, f.fallback.Name(), ferr)
	}
	fr.Note = f.startNote
	if perr != nil {
		fr.Note = fmt.Sprintf("%s: %v: using %s", f.primary.Name(), perr, f.fallback.Name())
		f.announce(fr.Note)
	}
	return fr, nil
}
