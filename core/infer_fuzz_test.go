package core

import (
	"encoding/binary"
	"testing"
)

// FuzzShapeInference builds graphs from arbitrary dimensions and ops: building never panics,
// and every shape a graph accepts is within MaxDim and MaxElements (so no element count wraps).
func FuzzShapeInference(f *testing.F) {
	seed := func(ops []byte, dims ...int64) []byte {
		b := append([]byte{}, ops...)
		for _, d := range dims {
			b = binary.LittleEndian.AppendUint64(b, uint64(d))
		}
		return b
	}
	f.Add(seed([]byte{0, 1, 2, 3}, 4, 8, 2, 16))
	f.Add(seed([]byte{2, 2, 2, 2}, 16, 65552, 61681, 4562284561))
	f.Add(seed([]byte{1, 4, 5, 6}, 1<<21, 1<<20, 3, 1))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 4 {
			return
		}
		ops, rest := data[:4], data[4:]
		var dims []int64
		for len(rest) >= 8 && len(dims) < 8 {
			dims = append(dims, int64(binary.LittleEndian.Uint64(rest)))
			rest = rest[8:]
		}
		if len(dims) == 0 {
			return
		}
		g := NewGraph()
		x := g.Input("x", F32, dims[:min(len(dims), 2)]...)
		y := g.Input("y", F32, dims[len(dims)-min(len(dims), 2):]...)
		cur := x
		for _, op := range ops {
			switch op % 7 {
			case 0:
				cur = g.Add(cur, y)
			case 1:
				cur = g.MatMul(cur, y)
			case 2:
				cur = g.Reshape(cur, dims[min(1, len(dims)-1):]...)
			case 3:
				cur = g.Permute(cur, 1, 0)
			case 4:
				cur = g.Concat(0, cur, y)
			case 5:
				cur = g.Mul(cur, g.Reshape(y, dims[:min(len(dims), 4)]...))
			case 6:
				cur = g.Slice(cur, 0, 0, dims[0])
			}
		}
		if g.Err() != nil {
			return
		}
		for _, tn := range g.Tensors {
			for _, d := range tn.Shape {
				if d < 0 || d > MaxDim {
					t.Fatalf("%s: dimension %d accepted in %s", tn.Name, d, tn.Shape)
				}
			}
			if n := tn.Shape.NumElements(); n < 0 || n > MaxElements {
				t.Fatalf("%s: %s accepted with %d elements", tn.Name, tn.Shape, n)
			}
		}
	})
}
