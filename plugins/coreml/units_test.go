package coreml

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// TestUnitsContextOption: the "units" context option (coreml{units=ane}) chooses the compute
// units of what one context prepares, over the backend's default; a bad value is refused.
func TestUnitsContextOption(t *testing.T) {
	b, err := New(WithUnits("gpu"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	dev := b.Devices()[0]
	for _, tc := range []struct {
		options map[string]string
		want    string
	}{
		{nil, "gpu"},
		{map[string]string{"units": "ane"}, "ane"},
		{map[string]string{"units": "cpu", "cache_dir": t.TempDir()}, "cpu"},
	} {
		c, err := dev.NewContext(context.Background(), tc.options)
		require.NoError(t, err, tc.options)
		assert.Equal(t, tc.want, c.(*cmlContext).units, tc.options)
		require.NoError(t, c.Close())
	}
	_, err = dev.NewContext(context.Background(), map[string]string{"units": "tpu"})
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.ErrorContains(t, err, "units")
}
