// Package energy measures (or, where nothing can be read, models) the energy a piece of work
// costs, behind one Meter interface:
//
//   - PowerSupply: a Linux/Android battery (/sys/class/power_supply/*/current_now × voltage_now),
//     sampled in the background (50 ms, as MNN-AECS polls BatteryManager) and integrated;
//   - RAPL: Intel/AMD powercap energy counters (/sys/class/powercap/intel-rapl:N/energy_uj);
//   - Model: a power model (watts as a function of what runs) times the elapsed time. Its
//     readings are flagged Modelled and its name says "model:", so a modelled figure is never
//     shown as measured.
//
// Open picks the first that can be read and says why the others could not. CPUTime (getrusage)
// is the measurable proxy where there is no meter at all (a VM): CPU-seconds, not joules.
package energy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// Sentinel errors, each wrapped with the details.
var (
	// ErrNoMeter: nothing under the root can be read as a meter of this kind.
	ErrNoMeter = errors.New("energy: no meter")
	// ErrWindowTooShort: Stop came sooner than MinWindow after Start (or with too few samples);
	// the figure would be mostly the meter's update interval.
	ErrWindowTooShort = errors.New("energy: measurement window too short")
	// ErrNonsense: the meter gave a negative, non-finite or implausible figure.
	ErrNonsense = errors.New("energy: meter reading is nonsense")
	// ErrState: Stop without Start, or Start twice.
	ErrState = errors.New("energy: meter not started (or started twice)")
)

// Reading is one measurement window.
type Reading struct {
	Meter    string        // the meter's Name
	Joules   float64       // energy over the window
	Window   time.Duration // Start to Stop
	Samples  int           // samples integrated (counter reads for RAPL, 0 for a model)
	Modelled bool          // true when Joules comes from a model, not a measurement
	Note     string        // e.g. why a fallback meter answered
}

// Watts is the mean power over the window.
func (r Reading) Watts() float64 {
	if r.Window <= 0 {
		return 0
	}
	return r.Joules / r.Window.Seconds()
}

// Meter measures energy over a window. A Meter is used by one goroutine at a time.
type Meter interface {
	// Name says what the meter is ("power_supply:battery", "rapl:package-0", "model:...").
	Name() string
	// Modelled is true for a model-based meter.
	Modelled() bool
	// SampleInterval is how often the meter samples (or how often its source updates).
	SampleInterval() time.Duration
	// MinWindow is the shortest window whose reading is reliable; Stop fails sooner.
	MinWindow() time.Duration
	// Start opens a window. ctx bounds the background sampling.
	Start(ctx context.Context) error
	// Stop closes the window and returns its energy.
	Stop() (Reading, error)
}

// maxPlausibleWatts bounds a phone or a desktop package: above it a reading is a unit mix-up.
const maxPlausibleWatts = 1000

// check applies the rules every meter shares: a window long enough, a finite non-negative
// energy and a plausible power.
func check(r Reading, minWindow time.Duration) (Reading, error) {
	if r.Window <= 0 || r.Window < minWindow {
		return r, fmt.Errorf("%w: %s: %v < %v", ErrWindowTooShort, r.Meter, r.Window, minWindow)
	}
	if math.IsNaN(r.Joules) || math.IsInf(r.Joules, 0) || r.Joules < 0 {
		return r, fmt.Errorf("%w: %s: %g J over %v", ErrNonsense, r.Meter, r.Joules, r.Window)
	}
	if r.Joules == 0 {
		return r, fmt.Errorf("%w: %s: 0 J over %v (the counter did not move)", ErrNonsense, r.Meter, r.Window)
	}
	if w := r.Watts(); w > maxPlausibleWatts {
		return r, fmt.Errorf("%w: %s: %.0f W", ErrNonsense, r.Meter, w)
	}
	return r, nil
}
