package main

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/xpuhub/xpu/core"
)

func TestDevicesUnits(t *testing.T) {
	tests := []struct {
		name  string
		units string
		code  int
		out   []string // on stdout
		err   string   // on stderr
	}{
		{"one", "ref", 0, []string{"UNIT", "ref:0", "open"}, ""},
		{"options in the name", "ref{threads=1},ref:0", 0, []string{"ref:0{threads=1}", "ref:0 "}, ""},
		{"no such device", "ref,ref:3", 1, []string{"ref:0", "ref:3", "failed: unit ref:3: no device ref:3 (there are: ref:0)"}, ""},
		{"no such backend", "no-such-backend", 1, []string{"no-such-backend:0", "failed:", "not found"}, ""},
		{"bad spec", "ref{", 2, nil, "bad unit spec"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "devices", "--units", tt.units)
			assert.Equal(t, tt.code, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
			for _, s := range tt.out {
				assert.Contains(t, out, s)
			}
			assert.Contains(t, errOut, tt.err)
		})
	}
}

func TestDevicesUnitsJSON(t *testing.T) {
	code, out, errOut := runCLI(t, "devices", "--json", "--units", "ref{a=1},nope")
	require.Equal(t, 1, code, errOut)
	var rows []unitRow
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Len(t, rows, 2)
	assert.Equal(t, unitRow{Unit: "ref:0{a=1}", Device: rows[0].Device, Kind: "cpu", Options: map[string]string{"a": "1"}, OK: true}, rows[0])
	assert.False(t, rows[1].OK)
	assert.Equal(t, "nope:0", rows[1].Unit)
	assert.NotEmpty(t, rows[1].Error)
}

func TestDevicesListsUnitNames(t *testing.T) {
	code, out, errOut := runCLI(t, "devices", "--json")
	require.Equal(t, 0, code, errOut)
	var rows []deviceRow
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	for _, r := range rows {
		if r.Device != "" {
			assert.True(t, strings.HasPrefix(r.Unit, r.Backend+":"), "%+v", r)
			// the name reads back as a unit of that device
			code, _, errOut := runCLI(t, "devices", "--units", r.Unit)
			assert.Equal(t, 0, code, "%s: %s", r.Unit, errOut)
		}
	}
}

// The built-in Core ML backend (registered by the binary's imports) is listed like the plugins:
// off Apple systems with score 0 and the probe's reason.
func TestDevicesListsCoreML(t *testing.T) {
	b, ok := core.Lookup("coreml")
	require.True(t, ok, "xpu links the Core ML backend in")
	rows := builtInRows(context.Background(), b)
	require.NotEmpty(t, rows)
	assert.Equal(t, "coreml", rows[0].Backend)
	if runtime.GOOS != "darwin" {
		require.Len(t, rows, 1)
		assert.Zero(t, rows[0].Score)
		assert.Contains(t, rows[0].Reason, "only on Apple systems")
	}
}
