package ref

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

func TestEncodeRoundsOnce(t *testing.T) {
	tests := []struct {
		name string
		dt   core.DType
		x    float64
		want uint16
	}{
		// Just above the f16 tie 1+2^-11: f32 would first round to the tie, then to even (1).
		{"f16 above tie", core.F16, 1 + 0x1p-11 + 0x1p-40, 0x3c01},
		{"f16 below tie", core.F16, 1 + 0x1p-11 - 0x1p-40, 0x3c00},
		{"f16 exact tie to even", core.F16, 1 + 0x1p-11, 0x3c00},
		{"f16 negative above tie", core.F16, -(1 + 0x1p-11 + 0x1p-40), 0xbc01},
		{"f16 overflow", core.F16, 1e300, 0x7c00},
		{"f16 NaN", core.F16, math.NaN(), 0x7e00},
		{"bf16 above tie", core.BF16, 1 + 0x1p-8 + 0x1p-40, 0x3f81},
		{"bf16 exact tie to even", core.BF16, 1 + 0x1p-8, 0x3f80},
		{"bf16 overflow", core.BF16, 1e300, 0x7f80},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := encode(tc.dt, []float64{tc.x})
			require.NoError(t, err)
			assert.Equal(t, u16s(tc.want), b)
		})
	}
	_, err := encode(core.Q8_0, []float64{1})
	assert.ErrorIs(t, err, core.ErrInternal)
}
