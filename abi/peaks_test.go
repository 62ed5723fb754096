package abi

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/loader/plugintest"
)

// The declared peaks (ABI 1.1) arrive from a plugin that writes them; a plugin built against
// ABI 1.0, which stops before them, leaves them unknown (0) and loads as before.
func TestDevicePeaks(t *testing.T) {
	tests := []struct {
		name    string
		defines []string
		want    core.Peaks
	}{
		{"declared", nil, core.Peaks{ReadBytesPerSec: 12e9, FLOPSF32: 34e9}},
		{"ABI 1.0 plugin", []string{"TP_DEVICE_INFO_1_0"}, core.Peaks{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Open(plugintest.Plugin(t, tt.defines...))
			require.NoError(t, err)
			defer p.Close()
			di, st := p.DeviceInfo(0)
			require.Equal(t, StatusOK, st)
			assert.Equal(t, tt.want, di.Peaks)
			assert.Equal(t, "test cpu", di.Name, "the ABI 1.0 part is read either way")
		})
	}
}
