package core

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Device kinds, precisions, dtypes and ops print their names, and an unknown value says so.
func TestEnumNames(t *testing.T) {
	for _, tc := range []struct {
		got  fmt.Stringer
		want string
	}{
		{DeviceCPU, "cpu"}, {DeviceGPU, "gpu"}, {DeviceNPU, "npu"}, {DeviceAccel, "accel"}, {DeviceKind(9), "kind(9)"},
		{PrecDefault, "default"}, {PrecInt8, "int8"}, {PrecInt4, "int4"}, {Precision(40), "?"},
		{F32, "f32"}, {Q3_K, "q3_k"}, {DType(200), "dtype(200)"},
		{OpAdd, "ADD"}, {OpAttention, "ATTENTION"}, {Op(5000), "op(5000)"},
	} {
		assert.Equal(t, tc.want, tc.got.String())
	}
}

// Parsing reads every name String writes, in any case; the invalid value's name and unknown
// names are ErrNotFound.
func TestParseEnums(t *testing.T) {
	for _, dt := range AllDTypes {
		got, err := ParseDType(dt.String())
		require.NoError(t, err)
		assert.Equal(t, dt, got)
	}
	got, err := ParseDType("Q8_0")
	require.NoError(t, err)
	assert.Equal(t, Q8_0, got)
	for _, s := range []string{"invalid", "q9_k", ""} {
		_, err := ParseDType(s)
		assert.ErrorIs(t, err, ErrNotFound, s)
	}
	op, err := ParseOp("rms_norm")
	require.NoError(t, err)
	assert.Equal(t, OpRMSNorm, op)
	_, err = ParseOp("INVALID")
	assert.ErrorIs(t, err, ErrNotFound)
	_, err = ParseOp("CONV2D")
	assert.EqualError(t, err, `op "CONV2D": not found`)
}
