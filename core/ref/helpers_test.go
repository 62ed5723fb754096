package ref

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

var nan = float32(math.NaN())

// opCase builds a graph whose single output is compared with want (float outputs, decoded to
// f32) or wantBytes (exact bytes).
type opCase struct {
	name      string
	build     func(g *core.Graph) *core.Tensor
	shape     core.Shape // expected output shape; nil skips the check
	want      []float32
	wantBytes []byte
	tol       float64  // absolute below 1, relative above; 0 means 1e-6
	inputs    [][]byte // bytes for the graph's inputs, if it has any
}

// c32 adds an F32 constant.
func c32(g *core.Graph, shape core.Shape, vals ...float32) *core.Tensor {
	return g.Const("c", core.F32, shape, core.EncodeF32(vals))
}

// c16 adds an F16 constant.
func c16(g *core.Graph, shape core.Shape, vals ...float32) *core.Tensor {
	b, err := core.Quantize(core.F16, vals, 0)
	if err != nil {
		panic(err)
	}
	return g.Const("h", core.F16, shape, b)
}

// ci32 adds an I32 constant.
func ci32(g *core.Graph, shape core.Shape, vals ...int32) *core.Tensor {
	return g.Const("i", core.I32, shape, core.EncodeI32(vals))
}

func runCases(t *testing.T, cases []opCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := core.NewGraph()
			out := tc.build(g)
			g.Output(out)
			require.NoError(t, g.Err())
			if tc.shape != nil {
				assert.Truef(t, tc.shape.Equal(out.Shape), "output shape %s, want %s", out.Shape, tc.shape)
			}
			res, err := Run(context.Background(), g, tc.inputs)
			require.NoError(t, err)
			require.Len(t, res, 1)
			if tc.wantBytes != nil || !out.DType.Float() {
				assert.Equal(t, tc.wantBytes, res[0])
				return
			}
			got, err := core.Dequantize(out.DType, res[0], 0)
			require.NoError(t, err)
			assertFloats(t, tc.want, got, tc.tol)
		})
	}
}

func assertFloats(t *testing.T, want, got []float32, tol float64) {
	t.Helper()
	if tol == 0 {
		tol = 1e-6
	}
	require.Len(t, got, len(want))
	for i := range want {
		w, g := float64(want[i]), float64(got[i])
		switch {
		case math.IsNaN(w):
			assert.Truef(t, math.IsNaN(g), "value %d: got %g, want NaN", i, g)
		case math.IsInf(w, 0):
			assert.Equalf(t, w, g, "value %d", i)
		default:
			assert.InDeltaf(t, w, g, tol*math.Max(1, math.Abs(w)), "value %d", i)
		}
	}
}

func u16s(vs ...uint16) []byte {
	b := make([]byte, 2*len(vs))
	for i, v := range vs {
		binary.LittleEndian.PutUint16(b[2*i:], v)
	}
	return b
}
