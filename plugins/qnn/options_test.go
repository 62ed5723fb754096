package qnn_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

// TestContextOptions: the HTP power vote and the HVX threads are context options
// (qnn{perf=balanced,hvx_threads=4}); a context with them runs a block as one without does,
// and a bad value or an unknown key is refused at context creation, naming it.
func TestContextOptions(t *testing.T) {
	b := openBackend(t)
	ctx := context.Background()
	g, inputs := blockGraph(core.F32)
	want, err := ref.Run(ctx, g, inputs)
	require.NoError(t, err)
	for _, opts := range []map[string]string{
		{"perf": "balanced", "hvx_threads": "4"},
		{"perf": "off"},
		{"perf": "burst", "hvx_threads": "1"},
	} {
		cc, err := b.Devices()[0].NewContext(ctx, opts)
		require.NoError(t, err, "%v", opts)
		exe, err := cc.Prepare(ctx, g)
		require.NoError(t, err, "%v", opts)
		got := execute(t, cc, exe, g, inputs)
		require.NoError(t, exe.Close())
		require.NoError(t, cc.Close())
		for i := range want {
			assert.Less(t, nmse(decode(core.F32, got[i]), decode(core.F32, want[i])), 1e-3, "%v output %d", opts, i)
		}
	}
	for _, tc := range []struct {
		opts map[string]string
		want string
	}{
		{map[string]string{"perf": "turbo"}, "perf=turbo"},
		{map[string]string{"hvx_threads": "0"}, "hvx_threads=0"},
		{map[string]string{"hvx_threads": "four"}, "hvx_threads=four"},
		{map[string]string{"colour": "red"}, "unknown option"},
	} {
		_, err := b.Devices()[0].NewContext(ctx, tc.opts)
		require.ErrorIs(t, err, core.ErrInvalidArgument, "%v", tc.opts)
		assert.Contains(t, err.Error(), tc.want)
	}
}
