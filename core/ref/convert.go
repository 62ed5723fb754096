package ref

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// evalGetRows gathers and dequantizes rows of table [R, K] by I32 ids.
func evalGetRows(n *nodeInfo, in []value, out tensorInfo) ([]byte, error) {
	table, ids := in[0], in[1].ints()
	R, K := table.shape[0], table.shape[1]
	rowBytes := table.dt.Bytes(K)
	res := make([]float64, 0, out.shape.NumElements())
	for i, id := range ids {
		if int64(id) < 0 || int64(id) >= R {
			return nil, fmt.Errorf("id %d at position %d is outside the table's %d rows: %w", id, i, R, core.ErrInvalidArgument)
		}
		row := value{dt: table.dt, shape: core.Shape{K}, b: table.b[int64(id)*rowBytes:][:rowBytes]}
		xs, err := row.floats(n.fattr[0])
		if err != nil {
			return nil, err
		}
		res = append(res, xs...)
	}
	return encode(core.F32, res)
}

// evalCast converts between F32, F16, BF16 (and from I32), rounding once.
func evalCast(x value, out tensorInfo) ([]byte, error) {
	xs, err := x.floats(0)
	if err != nil {
		return nil, err
	}
	return encode(out.dt, xs)
}

// evalQuantize quantizes an F32 tensor to Q8_0, Q4_0, a K-quant or I8 with core.Quantize (the one codec).
func evalQuantize(n *nodeInfo, x value, out tensorInfo) ([]byte, error) {
	return core.Quantize(out.dt, core.DecodeF32(x.b), n.fattr[0])
}

// evalDequantize decodes Q8_0, Q4_0, a K-quant or I8 to F32.
func evalDequantize(n *nodeInfo, x value) ([]byte, error) {
	xs, err := x.floats(n.fattr[0])
	if err != nil {
		return nil, err
	}
	return encode(core.F32, xs)
}
