package sched

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

func TestParseUnitSpec(t *testing.T) {
	tests := []struct {
		in, canon string
		opts      map[string]string
	}{
		{"neon", "neon:0", nil},
		{"qnn:1", "qnn:1", nil},
		{" neon{cpus=0,threads=1} ", "neon:0{cpus=0;threads=1}", map[string]string{"cpus": "0", "threads": "1"}},
		{"neon:0{cpus=0,1,threads=2}", "neon:0{cpus=0,1;threads=2}", map[string]string{"cpus": "0,1", "threads": "2"}},
		{"neon{cpus=0,1;threads=2}", "neon:0{cpus=0,1;threads=2}", map[string]string{"cpus": "0,1", "threads": "2"}},
		{"opencl{}", "opencl:0", nil},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			u, err := ParseUnitSpec(tt.in)
			require.NoError(t, err)
			assert.Equal(t, tt.canon, u.String())
			assert.Equal(t, tt.opts, u.Options)
			again, err := ParseUnitSpec(u.String())
			require.NoError(t, err)
			assert.Equal(t, u, again, "the canonical form reads back")
		})
	}
}

func TestParseUnitSpecErrors(t *testing.T) {
	for _, in := range []string{"", ":0", "neon:x", "neon:-1", "neon{cpus=0", "neon{,x}", "neon{a=1,a=2}",
		"neon{{a=1}}", "ne on"} {
		t.Run(in, func(t *testing.T) {
			_, err := ParseUnitSpec(in)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrBadUnitSpec)
			assert.ErrorIs(t, err, core.ErrInvalidArgument)
		})
	}
}

func TestParseUnitList(t *testing.T) {
	us, err := ParseUnitList("neon{cpus=0,threads=1}, neon{cpus=1,threads=1},opencl,qnn:0")
	require.NoError(t, err)
	var names []string
	for _, u := range us {
		names = append(names, u.String())
	}
	assert.Equal(t, []string{"neon:0{cpus=0;threads=1}", "neon:0{cpus=1;threads=1}", "opencl:0", "qnn:0"}, names)
	_, err = ParseUnitList(" , ")
	assert.ErrorIs(t, err, ErrBadUnitSpec)
	_, err = ParseUnitList("neon,ne on")
	assert.ErrorIs(t, err, ErrBadUnitSpec)
}

func TestOpenUnit(t *testing.T) {
	ctx := context.Background()
	b := ref.New()
	defer b.Close()
	devs := b.Devices()
	spec, err := ParseUnitSpec("ref{threads=1}")
	require.NoError(t, err)
	dev, err := FindDevice(spec, devs)
	require.NoError(t, err)
	u, err := OpenUnit(ctx, dev, spec)
	require.NoError(t, err)
	assert.Equal(t, "ref:0{threads=1}", u.Name())
	assert.Same(t, dev, u.Device())
	require.NoError(t, u.Close())
	require.NoError(t, u.Close(), "closing twice is a no-op")

	_, err = FindDevice(UnitSpec{Backend: "npu9"}, devs)
	assert.ErrorIs(t, err, core.ErrNotFound)
	assert.ErrorContains(t, err, "ref:0", "the error lists the devices there are")
	_, err = OpenUnit(ctx, dev, UnitSpec{Backend: "neon"})
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
}
