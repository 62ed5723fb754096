package energy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Gate errors: the measurement conditions MNN-AECS requires (cooled below 40 °C, battery above
// 50 %, unplugged) are not met.
var (
	ErrTooHot     = errors.New("energy: too hot to measure")
	ErrBatteryLow = errors.New("energy: battery too low to measure")
	ErrPluggedIn  = errors.New("energy: plugged in (the battery meter would read the charger)")
)

// Conditions is what the gates read. A field whose files are absent is left at its zero value
// with the Has flag false: the gate then does not apply (and Describe says so).
type Conditions struct {
	HasThermal  bool
	MaxTempC    float64 // hottest thermal zone
	HotZone     string
	HasBattery  bool
	BatteryPct  int
	Status      string // power_supply status: Discharging, Charging, Full, Not charging
	ExternalPow bool   // a non-battery supply reports online=1
}

// Limits are the gate thresholds (MNN-AECS's test conditions by default).
type Limits struct {
	MaxTempC      float64 // 40
	MinBatteryPct int     // 50
}

// DefaultLimits are the paper's test conditions.
var DefaultLimits = Limits{MaxTempC: 40, MinBatteryPct: 50}

// ReadConditions reads thermal zones and batteries under the root.
func ReadConditions(opts ...Option) Conditions {
	c := newConfig(opts)
	var out Conditions
	zones, _ := filepath.Glob(filepath.Join(c.root, "sys/class/thermal/thermal_zone*/temp"))
	for _, z := range zones {
		v, err := readFloat(z)
		if err != nil || v <= -273000 {
			continue
		}
		t := v / 1000 // millidegrees
		if !out.HasThermal || t > out.MaxTempC {
			out.MaxTempC, out.HotZone = t, filepath.Base(filepath.Dir(z))
			if ty := readText(filepath.Join(filepath.Dir(z), "type")); ty != "" {
				out.HotZone += " (" + ty + ")"
			}
		}
		out.HasThermal = true
	}
	supplies, _ := os.ReadDir(filepath.Join(c.root, "sys/class/power_supply"))
	for _, s := range supplies {
		dir := filepath.Join(c.root, "sys/class/power_supply", s.Name())
		switch readText(filepath.Join(dir, "type")) {
		case "Battery":
			if p, err := strconv.Atoi(readText(filepath.Join(dir, "capacity"))); err == nil && !out.HasBattery {
				out.HasBattery, out.BatteryPct = true, p
				out.Status = readText(filepath.Join(dir, "status"))
			}
		case "":
		default:
			if readText(filepath.Join(dir, "online")) == "1" {
				out.ExternalPow = true
			}
		}
	}
	return out
}

// Check applies the limits: ErrTooHot, ErrBatteryLow or ErrPluggedIn (wrapped with the
// reading), or nil. Gates whose files are absent pass.
func (c Conditions) Check(l Limits) error {
	var errs []error
	if c.HasThermal && c.MaxTempC >= l.MaxTempC {
		errs = append(errs, fmt.Errorf("%w: %s at %.1f °C (limit %.0f °C)", ErrTooHot, c.HotZone, c.MaxTempC, l.MaxTempC))
	}
	if c.HasBattery {
		if c.BatteryPct < l.MinBatteryPct {
			errs = append(errs, fmt.Errorf("%w: %d %% (limit %d %%)", ErrBatteryLow, c.BatteryPct, l.MinBatteryPct))
		}
		if c.ExternalPow || strings.EqualFold(c.Status, "Charging") || strings.EqualFold(c.Status, "Full") {
			errs = append(errs, fmt.Errorf("%w: status %q", ErrPluggedIn, c.Status))
		}
	}
	return errors.Join(errs...)
}

// Describe says what the gates saw, in one line.
func (c Conditions) Describe() string {
	var parts []string
	if c.HasThermal {
		parts = append(parts, fmt.Sprintf("hottest zone %s %.1f °C", c.HotZone, c.MaxTempC))
	} else {
		parts = append(parts, "thermal gate: no thermal zones")
	}
	if c.HasBattery {
		parts = append(parts, fmt.Sprintf("battery %d %% %s", c.BatteryPct, c.Status))
	} else {
		parts = append(parts, "battery gate: no battery")
	}
	return strings.Join(parts, ", ")
}

// WaitCool re-reads the conditions every poll until the thermal gate passes, for at most
// timeout; the battery gates fail at once (waiting does not charge a battery). It returns the
// last conditions and the gate error, if any.
func WaitCool(ctx context.Context, l Limits, timeout, poll time.Duration, opts ...Option) (Conditions, error) {
	deadline := time.Now().Add(timeout)
	for {
		c := ReadConditions(opts...)
		err := c.Check(l)
		if err == nil || !errors.Is(err, ErrTooHot) || errors.Is(err, ErrBatteryLow) || errors.Is(err, ErrPluggedIn) {
			return c, err
		}
		if time.Now().After(deadline) {
			return c, fmt.Errorf("after waiting %v to cool down: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return c, ctx.Err()
		case <-time.After(poll):
		}
	}
}
