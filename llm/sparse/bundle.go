package sparse

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
)

// BuildBundles returns layer l's [F, 3D] bundle matrix in the model's FFN dtype, row i holding
// neuron order[i]'s gate row, up row and down column. Gate and up rows are copied byte for
// byte; the down column is gathered from the dequantized down matrix and quantized along D
// (exact for F32/F16, a requantization for Q8_0/Q4_0: see the package doc).
func BuildBundles(m *llm.Model, l int, order []int32) ([]byte, error) {
	c := m.Config
	D, F := int64(c.Dim), int64(c.FFN)
	p := fmt.Sprintf("blk.%d.", l)
	gate, gok := m.File.Tensor(p + "ffn_gate.weight")
	up, uok := m.File.Tensor(p + "ffn_up.weight")
	down, dok := m.File.Tensor(p + "ffn_down.weight")
	if !gok || !uok || !dok {
		return nil, fmt.Errorf("sparse: layer %d has no gated FFN (ffn_gate, ffn_up, ffn_down): %w", l, core.ErrUnsupported)
	}
	dt := gate.DType
	switch dt {
	case core.F32, core.F16, core.Q8_0, core.Q4_0:
	default:
		return nil, fmt.Errorf("sparse: FFN dtype %s (bundles take F32, F16, Q8_0, Q4_0): %w", dt, core.ErrUnsupported)
	}
	if up.DType != dt || !gate.Shape.Equal(core.Shape{F, D}) || !up.Shape.Equal(core.Shape{F, D}) || !down.Shape.Equal(core.Shape{D, F}) {
		return nil, fmt.Errorf("sparse: layer %d FFN shapes gate %s%v up %s%v down %v: %w", l, gate.DType, gate.Shape, up.DType, up.Shape, down.Shape, core.ErrUnsupported)
	}
	if len(order) != int(F) {
		return nil, fmt.Errorf("sparse: order of %d neurons for F %d: %w", len(order), F, core.ErrInvalidArgument)
	}
	gb, ub := m.File.TensorData(gate), m.File.TensorData(up)
	dvals, err := core.Dequantize(down.DType, m.File.TensorData(down), 0)
	if err != nil {
		return nil, fmt.Errorf("sparse: layer %d down: %w", l, err)
	}
	seg := dt.Bytes(D)
	row := 3 * seg
	out := make([]byte, F*row)
	col := make([]float32, D)
	for i, n := range order {
		if n < 0 || int64(n) >= F {
			return nil, fmt.Errorf("sparse: order[%d] = %d outside [0, %d): %w", i, n, F, core.ErrInvalidArgument)
		}
		r := out[int64(i)*row : int64(i+1)*row]
		copy(r[:seg], gb[int64(n)*seg:int64(n+1)*seg])
		copy(r[seg:2*seg], ub[int64(n)*seg:int64(n+1)*seg])
		for d := int64(0); d < D; d++ {
			col[d] = dvals[d*F+int64(n)]
		}
		q, err := core.Quantize(dt, col, 0)
		if err != nil {
			return nil, fmt.Errorf("sparse: layer %d down column %d: %w", l, n, err)
		}
		copy(r[2*seg:], q)
	}
	return out, nil
}
