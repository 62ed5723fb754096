package sched_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

func TestParsePolicy(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr bool
	}{
		{"prefer-npu", "prefer-npu", false},
		{"PREFER-GPU", "prefer-gpu", false},
		{"prefer-cpu", "prefer-cpu", false},
		{"max-performance", "max-performance", false},
		{"max-efficiency", "max-efficiency", false},
		{"by-name:neon,ref", "by-name:neon,ref", false},
		{"neon, ref", "by-name:neon,ref", false},
		{"opencl:0", "by-name:opencl:0", false},
		{"", "", true},
		{"by-name:", "", true},
		{",,", "", true},
		{"a b", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			p, err := sched.ParsePolicy(tt.in)
			if tt.wantErr {
				assert.ErrorIs(t, err, core.ErrInvalidArgument)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, p.Name())
		})
	}
}

func TestByNameRank(t *testing.T) {
	neon := newFake("neon", core.DeviceCPU)
	gpu0 := newFake("opencl", core.DeviceGPU)
	gpu1 := newFake("opencl", core.DeviceGPU)
	gpu1.index = 1
	all := devs(neon, gpu0, gpu1)
	tests := []struct {
		names []string
		want  []core.Device
	}{
		{[]string{"opencl"}, devs(gpu0, gpu1)},
		{[]string{"opencl:1", "neon"}, devs(gpu1, neon)},
		{[]string{"neon", "neon:0", "opencl:1", "opencl"}, devs(neon, gpu1, gpu0)},
		{[]string{"qnn"}, nil},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, sched.ByName(tt.names...).Rank(nil, all), "%v", tt.names)
	}
}

func FuzzParsePolicy(f *testing.F) {
	for _, s := range []string{"prefer-npu", "by-name:neon,ref", "neon:0", "", ",", "max-efficiency"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := sched.ParsePolicy(s)
		if err != nil {
			return
		}
		again, err := sched.ParsePolicy(p.Name())
		require.NoError(t, err, "a policy's name parses: %q", p.Name())
		assert.Equal(t, p.Name(), again.Name())
	})
}
