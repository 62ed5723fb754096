package w8a8

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

func TestShadowModes(t *testing.T) {
	for _, c := range []struct {
		s    string
		want ShadowMode
	}{{"off", ShadowOff}, {"on", ShadowOn}, {"pruned", ShadowPruned}} {
		got, err := ParseShadowMode(c.s)
		require.NoError(t, err)
		assert.Equal(t, c.want, got)
		assert.Equal(t, c.s, got.String())
	}
	_, err := ParseShadowMode("some")
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
}
