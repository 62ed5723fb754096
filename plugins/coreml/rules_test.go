package coreml

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/plugins/coreml/emu"
)

// program builds a one-input, one-output program with body and returns its spec and weights.
func program(body func(b *builder, x mvar) mvar) ([]byte, []byte) {
	b := newBuilder()
	x := mvar{name: "in_0", dt: milF32, shape: []int64{2, 4}}
	y := body(b, x)
	o := b.op("identity", []arg{{"x", []mvar{y}}}, y.dt, y.shape)
	l := &lowered{inputs: []feature{{x.name, 1, x.shape}}, outputs: []feature{{o.name, 1, o.shape}}}
	return encodeModel(b, []mvar{x}, l, []string{o.name}), b.blob.bytes()
}

func parse(spec, weights []byte) error {
	_, err := emu.Parse(spec, func(name string) ([]byte, error) {
		if name != weightFile {
			return nil, assert.AnError
		}
		return weights, nil
	})
	return err
}

// The emulator enforces what a Core ML compiler would: each case breaks one rule.
func TestEmulatorRejects(t *testing.T) {
	ok := func(b *builder, x mvar) mvar { return b.unary("relu", x) }
	spec, w := program(ok)
	require.NoError(t, parse(spec, w), "the unbroken program")
	cases := []struct {
		name string
		body func(b *builder, x mvar) mvar
		want string
	}{
		{"unknown op", func(b *builder, x mvar) mvar { return b.unary("frobnicate", x) }, "not an operation"},
		{"wrong output shape", func(b *builder, x mvar) mvar {
			return b.op("relu", []arg{{"x", []mvar{x}}}, x.dt, []int64{4, 2})
		}, "declares"},
		{"unknown parameter", func(b *builder, x mvar) mvar {
			return b.op("relu", []arg{{"x", []mvar{x}}, {"alpha", []mvar{b.intScalar(1)}}}, x.dt, x.shape)
		}, "no parameter \"alpha\""},
		{"missing parameter", func(b *builder, x mvar) mvar {
			return b.op("transpose", []arg{{"x", []mvar{x}}}, x.dt, []int64{4, 2})
		}, "lacks required parameter"},
		{"variable where a constant is required", func(b *builder, x mvar) mvar {
			s := b.cast(b.intVec(4, 2), milI32)
			s = b.binary("add", s, b.intVec(0, 0), []int64{2})
			return b.op("reshape", []arg{{"x", []mvar{x}}, {"shape", []mvar{s}}}, x.dt, []int64{4, 2})
		}, "compile-time constant"},
		{"undefined value", func(b *builder, x mvar) mvar {
			return b.unary("relu", mvar{name: "nowhere", dt: milF32, shape: x.shape})
		}, "not defined before"},
		{"mixed dtypes", func(b *builder, x mvar) mvar {
			return b.binary("add", x, b.cast(x, milF16), x.shape)
		}, "want one dtype"},
		{"bad broadcast", func(b *builder, x mvar) mvar {
			return b.binary("add", x, b.floats(milF32, []int64{3}, []float32{1, 2, 3}, nil), x.shape)
		}, "broadcast"},
		{"reshape changes the element count", func(b *builder, x mvar) mvar { return b.reshape(x, []int64{3, 3}) }, "elements"},
		{"slice out of range", func(b *builder, x mvar) mvar { return b.slice(x, 1, 2, 6) }, "on a dimension"},
		{"cast to an unknown dtype", func(b *builder, x mvar) mvar {
			return b.op("cast", []arg{{"x", []mvar{x}}, {"dtype", []mvar{b.strScalar("fp8")}}}, milF32, x.shape)
		}, "dtype \"fp8\""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec, w := program(func(b *builder, x mvar) mvar { return b.unary("relu", c.body(b, x)) })
			err := parse(spec, w)
			require.Error(t, err)
			assert.ErrorIs(t, err, emu.ErrInvalidModel)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestEmulatorRejectsBadWeightsAndVersions(t *testing.T) {
	big := make([]float32, 64)
	spec, w := program(func(b *builder, x mvar) mvar {
		return b.binary("add", x, b.floats(milF32, []int64{2, 4}, big[:8], nil), x.shape)
	})
	require.NoError(t, parse(spec, w))
	spec16, w16 := program(func(b *builder, x mvar) mvar {
		return b.cast(b.binary("add", b.cast(x, milF16), b.floats(milF16, []int64{2, 4}, big[:8], nil), x.shape), milF32)
	})
	require.NoError(t, parse(spec16, w16))

	t.Run("blob offset past the file", func(t *testing.T) {
		assert.ErrorContains(t, parse(spec16, w16[:64]), "outside")
	})
	t.Run("blob record overwritten", func(t *testing.T) {
		bad := append([]byte(nil), w16...)
		bad[64] ^= 0xff
		assert.ErrorContains(t, parse(spec16, bad), "no blob record")
	})
	t.Run("blob size does not match the type", func(t *testing.T) {
		bad := append([]byte(nil), w16...)
		bad[64+8]++
		assert.ErrorContains(t, parse(spec16, bad), "holds")
	})
	t.Run("not a version 2 weight file", func(t *testing.T) {
		bad := append([]byte(nil), w16...)
		bad[4] = 1
		assert.ErrorContains(t, parse(spec16, bad), "version 2")
	})
	t.Run("opset CoreML6 needs specification 7", func(t *testing.T) {
		require.Equal(t, []byte{0x08, specVersion}, spec[:2])
		bad := append([]byte{0x08, 6}, spec[2:]...)
		assert.ErrorContains(t, parse(bad, w), "needs specification version >= 7")
	})
	t.Run("ML Programs need specification 6", func(t *testing.T) {
		bad := append([]byte{0x08, 5}, spec[2:]...)
		assert.ErrorContains(t, parse(bad, w), ">= 6")
	})
	t.Run("truncated protobuf", func(t *testing.T) {
		assert.ErrorIs(t, parse(spec[:len(spec)-3], w), emu.ErrInvalidModel)
	})
}

// The parser must turn any byte string into a model or an error, never a panic.
func FuzzEmulatorParse(f *testing.F) {
	spec, w := program(func(b *builder, x mvar) mvar {
		y := b.binary("mul", x, b.floats(milF32, []int64{2, 4}, make([]float32, 8), nil), x.shape)
		return b.softmax(b.reshape(b.transpose(y, []int64{1, 0}), []int64{2, 4}))
	})
	f.Add(spec, w)
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, spec, weights []byte) {
		_, _ = emu.Parse(spec, func(string) ([]byte, error) { return weights, nil })
	})
}
