package energy

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const phone = "../cputopo/testdata/sd8gen3"

func write(t *testing.T, root, rel, v string) {
	t.Helper()
	p := filepath.Join(root, rel)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(v+"\n"), 0o644))
}

func battery(t *testing.T, current, voltage string) string {
	root := t.TempDir()
	write(t, root, "sys/class/power_supply/battery/type", "Battery")
	write(t, root, "sys/class/power_supply/battery/current_now", current)
	write(t, root, "sys/class/power_supply/battery/voltage_now", voltage)
	return root
}

func TestPowerSupplyIntegrates(t *testing.T) {
	// 1.2 A × 3.9 V = 4.68 W on the SD8 Gen 3 tree (current negative while discharging)
	m, err := OpenPowerSupply(WithRoot(phone), WithSampleInterval(2*time.Millisecond), WithMinWindow(20*time.Millisecond))
	require.NoError(t, err)
	assert.Equal(t, "power_supply:battery", m.Name())
	assert.False(t, m.Modelled())
	require.NoError(t, m.Start(context.Background()))
	require.ErrorIs(t, m.Start(context.Background()), ErrState)
	time.Sleep(60 * time.Millisecond)
	r, err := m.Stop()
	require.NoError(t, err)
	assert.InDelta(t, 4.68, r.Watts(), 0.01)
	assert.Greater(t, r.Samples, 3)
	assert.False(t, r.Modelled)
	_, err = m.Stop()
	assert.ErrorIs(t, err, ErrState)
}

func TestPowerSupplyBadInput(t *testing.T) {
	tests := []struct {
		name             string
		current, voltage string
		openErr          error
	}{
		{"negative voltage", "1000", "-3800000", ErrNoMeter},
		{"not a number", "x", "3800000", ErrNoMeter},
		{"kilowatts", "1000000000", "3800000000", ErrNoMeter},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := OpenPowerSupply(WithRoot(battery(t, tt.current, tt.voltage)))
			assert.ErrorIs(t, err, tt.openErr)
		})
	}
	t.Run("zero window", func(t *testing.T) {
		m, err := OpenPowerSupply(WithRoot(battery(t, "500000", "3800000")), WithSampleInterval(time.Millisecond))
		require.NoError(t, err)
		require.NoError(t, m.Start(context.Background()))
		_, err = m.Stop()
		assert.ErrorIs(t, err, ErrWindowTooShort)
	})
	t.Run("zero current", func(t *testing.T) {
		m, err := OpenPowerSupply(WithRoot(battery(t, "0", "3800000")), WithSampleInterval(time.Millisecond), WithMinWindow(5*time.Millisecond))
		require.NoError(t, err)
		require.NoError(t, m.Start(context.Background()))
		time.Sleep(20 * time.Millisecond)
		_, err = m.Stop()
		assert.ErrorIs(t, err, ErrNonsense)
	})
	t.Run("file turns to garbage mid-window", func(t *testing.T) {
		root := battery(t, "500000", "3800000")
		m, err := OpenPowerSupply(WithRoot(root), WithSampleInterval(time.Millisecond), WithMinWindow(5*time.Millisecond))
		require.NoError(t, err)
		require.NoError(t, m.Start(context.Background()))
		write(t, root, "sys/class/power_supply/battery/voltage_now", "-1")
		time.Sleep(20 * time.Millisecond)
		_, err = m.Stop()
		assert.ErrorIs(t, err, ErrNonsense)
	})
}

func TestRAPL(t *testing.T) {
	root := t.TempDir()
	z := "sys/class/powercap/intel-rapl:0/"
	write(t, root, z+"name", "package-0")
	write(t, root, z+"energy_uj", "999000000")
	write(t, root, z+"max_energy_range_uj", "1000000000")
	write(t, root, "sys/class/powercap/intel-rapl:0:0/energy_uj", "5") // a subzone: not summed
	m, err := OpenRAPL(WithRoot(root), WithMinWindow(time.Millisecond))
	require.NoError(t, err)
	assert.Equal(t, "rapl:package-0", m.Name())
	require.NoError(t, m.Start(context.Background()))
	write(t, root, z+"energy_uj", "2000000") // wrapped: 1 J to the top, 2 J after
	time.Sleep(5 * time.Millisecond)
	r, err := m.Stop()
	require.NoError(t, err)
	assert.InDelta(t, 3.0, r.Joules, 1e-9)

	// a counter that does not move is nonsense, not 0 W
	require.NoError(t, m.Start(context.Background()))
	time.Sleep(5 * time.Millisecond)
	_, err = m.Stop()
	assert.ErrorIs(t, err, ErrNonsense)

	_, err = OpenRAPL(WithRoot(t.TempDir()))
	assert.ErrorIs(t, err, ErrNoMeter)
}

func TestOpenPicksAndExplains(t *testing.T) {
	m, err := Open(WithRoot(phone))
	require.NoError(t, err)
	assert.Equal(t, "power_supply:battery", m.Name())

	_, err = Open(WithRoot("../cputopo/testdata/vm2"))
	require.ErrorIs(t, err, ErrNoMeter)
	assert.Contains(t, err.Error(), "power_supply: no battery")
	assert.Contains(t, err.Error(), "powercap")
}

func TestModelMeters(t *testing.T) {
	var w atomic.Value
	w.Store(2.0)
	m := NewModel("soc", func() float64 { return w.Load().(float64) })
	assert.True(t, m.Modelled())
	assert.Equal(t, "model:soc", m.Name())
	require.NoError(t, m.Start(context.Background()))
	time.Sleep(10 * time.Millisecond)
	r, err := m.Stop()
	require.NoError(t, err)
	assert.True(t, r.Modelled)
	assert.InDelta(t, 2.0, r.Watts(), 1e-9)

	w.Store(-1.0)
	require.NoError(t, m.Start(context.Background()))
	_, err = m.Stop()
	assert.ErrorIs(t, err, ErrNonsense)

	c := NewCPUTimeModel(0.5, 2)
	assert.Contains(t, c.Name(), "model:cpu-time")
	require.NoError(t, c.Start(context.Background()))
	end := time.Now().Add(80 * time.Millisecond)
	x := 0
	for time.Now().Before(end) {
		x++
	}
	r, err = c.Stop()
	require.NoError(t, err, "%d", x)
	assert.Greater(t, r.Joules, 0.5*0.08)
}

func TestFallbackAnnounces(t *testing.T) {
	root := battery(t, "0", "3800000") // reads, but integrates to 0 J: nonsense
	ps, err := OpenPowerSupply(WithRoot(root), WithSampleInterval(time.Millisecond), WithMinWindow(5*time.Millisecond))
	require.NoError(t, err)
	var heard []string
	f := NewFallback(ps, NewModel("soc", func() float64 { return 3 }), func(s string) { heard = append(heard, s) })
	require.NoError(t, f.Start(context.Background()))
	time.Sleep(20 * time.Millisecond)
	r, err := f.Stop()
	require.NoError(t, err)
	assert.True(t, r.Modelled)
	assert.Equal(t, "model:soc", r.Meter)
	assert.InDelta(t, 3, r.Watts(), 1e-9)
	require.Len(t, heard, 1)
	assert.Contains(t, heard[0], "power_supply:battery")
	assert.Contains(t, r.Note, "nonsense")

	// a good primary answers itself
	good, err := OpenPowerSupply(WithRoot(phone), WithSampleInterval(time.Millisecond), WithMinWindow(5*time.Millisecond))
	require.NoError(t, err)
	f = NewFallback(good, NewModel("soc", func() float64 { return 3 }), nil)
	require.NoError(t, f.Start(context.Background()))
	time.Sleep(20 * time.Millisecond)
	r, err = f.Stop()
	require.NoError(t, err)
	assert.False(t, r.Modelled)
	assert.Equal(t, "power_supply:battery", r.Meter)
}

func TestGates(t *testing.T) {
	c := ReadConditions(WithRoot(phone))
	require.True(t, c.HasThermal)
	require.True(t, c.HasBattery)
	assert.InDelta(t, 36.5, c.MaxTempC, 1e-9)
	assert.Equal(t, 80, c.BatteryPct)
	require.NoError(t, c.Check(DefaultLimits))

	vm := ReadConditions(WithRoot("../cputopo/testdata/vm2"))
	assert.False(t, vm.HasThermal)
	assert.False(t, vm.HasBattery)
	require.NoError(t, vm.Check(DefaultLimits))
	assert.Contains(t, vm.Describe(), "no thermal zones")

	root := t.TempDir()
	write(t, root, "sys/class/thermal/thermal_zone3/temp", "52000")
	write(t, root, "sys/class/power_supply/bms/type", "Battery")
	write(t, root, "sys/class/power_supply/bms/capacity", "30")
	write(t, root, "sys/class/power_supply/bms/status", "Charging")
	err := ReadConditions(WithRoot(root)).Check(DefaultLimits)
	assert.ErrorIs(t, err, ErrTooHot)
	assert.ErrorIs(t, err, ErrBatteryLow)
	assert.ErrorIs(t, err, ErrPluggedIn)

	hot := t.TempDir()
	write(t, hot, "sys/class/thermal/thermal_zone0/temp", "45000")
	_, err = WaitCool(context.Background(), DefaultLimits, 20*time.Millisecond, 5*time.Millisecond, WithRoot(hot))
	assert.ErrorIs(t, err, ErrTooHot)
	go func() {
		time.Sleep(10 * time.Millisecond)
		// rename, not WriteFile: a sysfs read is atomic, a truncate-then-write is not (WaitCool
		// could read the empty file between the two and see no thermal zone at all)
		dir := filepath.Join(hot, "sys/class/thermal/thermal_zone0")
		_ = os.WriteFile(filepath.Join(dir, "temp.new"), []byte("35000\n"), 0o644)
		_ = os.Rename(filepath.Join(dir, "temp.new"), filepath.Join(dir, "temp"))
	}()
	c, err = WaitCool(context.Background(), DefaultLimits, 2*time.Second, 2*time.Millisecond, WithRoot(hot))
	require.NoError(t, err)
	assert.InDelta(t, 35, c.MaxTempC, 1e-9)
}
