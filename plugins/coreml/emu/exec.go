package emu

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrExecution is wrapped by errors found while executing (a gather index out of range).
var ErrExecution = errors.New("coreml emulator: execution failed")

// tensor is a value during execution: floats (fp16 values are kept rounded to binary16), int32,
// bool or a string.
type tensor struct {
	Type
	f []float32
	i []int32
	b []bool
	s string
}

func newTensor(t Type) *tensor {
	x := &tensor{Type: t}
	switch t.DType {
	case F16, F32:
		x.f = make([]float32, t.numel())
	case I32:
		x.i = make([]int32, t.numel())
	case Bool:
		x.b = make([]bool, t.numel())
	}
	return x
}

// Predict runs the model. inputs and outputs hold each feature's bytes (little-endian, dense,
// row-major, the feature's dtype), by feature name; outputs are written in place.
func (m *Model) Predict(ctx context.Context, inputs, outputs map[string][]byte) error {
	env := map[string]*tensor{}
	for name, t := range m.consts {
		env[name] = t
	}
	for _, f := range m.Inputs {
		b, ok := inputs[f.Name]
		t := newTensor(Type{f.DType, f.Shape})
		if !ok || int64(len(b)) != t.numel()*elemSize(f.DType) {
			return fmt.Errorf("%w: input %q: %d bytes for %v", ErrExecution, f.Name, len(b), t.Type)
		}
		decode(t, b)
		env[f.Name] = t
	}
	for i := range m.ops {
		if i%64 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		op := &m.ops[i]
		if op.typ == "const" {
			continue
		}
		out, err := run(op, env)
		if err != nil {
			return err
		}
		if out.DType == F16 {
			for j, v := range out.f {
				out.f[j] = roundHalf(v)
			}
		}
		env[op.out] = out
	}
	for i, f := range m.Outputs {
		b, ok := outputs[f.Name]
		t := env[m.results[i]]
		if !ok || int64(len(b)) != t.numel()*elemSize(f.DType) {
			return fmt.Errorf("%w: output %q: %d bytes for %v", ErrExecution, f.Name, len(b), t.Type)
		}
		encode(t, b)
	}
	return nil
}

func elemSize(d DType) int64 {
	if d == F16 {
		return 2
	}
	return 4
}

func decode(t *tensor, b []byte) {
	for j := range t.numel() {
		switch t.DType {
		case F16:
			t.f[j] = halfToF32(binary.LittleEndian.Uint16(b[2*j:]))
		case F32:
			t.f[j] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:]))
		case I32:
			t.i[j] = int32(binary.LittleEndian.Uint32(b[4*j:]))
		}
	}
}

func encode(t *tensor, b []byte) {
	for j := range t.numel() {
		switch t.DType {
		case F16:
			binary.LittleEndian.PutUint16(b[2*j:], f32ToHalf(t.f[j]))
		case F32:
			binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(t.f[j]))
		case I32:
			binary.LittleEndian.PutUint32(b[4*j:], uint32(t.i[j]))
		}
	}
}

// strides of a shape, and the broadcast index map of a source shape into an output shape.
func bcastIndex(src, out []int64) []int64 {
	idx := make([]int64, numel(out))
	r := len(out)
	st := make([]int64, r) // strides of src aligned to out, 0 where broadcast
	acc := int64(1)
	for i := r - 1; i >= 0; i-- {
		j := len(src) - r + i
		if j >= 0 && src[j] != 1 {
			st[i] = acc
		}
		if j >= 0 {
			acc *= src[j]
		}
	}
	coord := make([]int64, r)
	for k := range idx {
		var o int64
		for i := range r {
			o += coord[i] * st[i]
		}
		idx[k] = o
		for i := r - 1; i >= 0; i-- {
			coord[i]++
			if coord[i] < out[i] {
				break
			}
			coord[i] = 0
		}
	}
	return idx
}

func numel(s []int64) int64 {
	n := int64(1)
	for _, d := range s {
		n *= d
	}
	return n
}

func run(op *operation, env map[string]*tensor) (*tensor, error) {
	in := func(p string) *tensor { return env[op.inputs[p][0]] }
	out := newTensor(op.outT)
	switch op.typ {
	case "add", "sub", "mul", "real_div", "less_equal":
		x, y := in("x"), in("y")
		ix, iy := bcastIndex(x.Shape, out.Shape), bcastIndex(y.Shape, out.Shape)
		for k := range ix {
			if x.DType == I32 {
				a, b := x.i[ix[k]], y.i[iy[k]]
				switch op.typ {
				case "add":
					out.i[k] = a + b
				case "sub":
					out.i[k] = a - b
				case "mul":
					out.i[k] = a * b
				case "less_equal":
					out.b[k] = a <= b
				}
				continue
			}
			a, b := x.f[ix[k]], y.f[iy[k]]
			switch op.typ {
			case "add":
				out.f[k] = a + b
			case "sub":
				out.f[k] = a - b
			case "mul":
				out.f[k] = a * b
			case "real_div":
				out.f[k] = a / b
			case "less_equal":
				out.b[k] = a <= b
			}
		}
	case "logical_and":
		x, y := in("x"), in("y")
		ix, iy := bcastIndex(x.Shape, out.Shape), bcastIndex(y.Shape, out.Shape)
		for k := range ix {
			out.b[k] = x.b[ix[k]] && y.b[iy[k]]
		}
	case "silu", "relu", "exp", "sin", "cos", "gelu", "rsqrt", "identity", "tanh":
		x := in("x")
		if x.DType == I32 || x.DType == Bool {
			copy(out.i, x.i)
			copy(out.b, x.b)
			break
		}
		eps := 1e-12
		if op.typ == "rsqrt" && len(op.inputs["epsilon"]) > 0 {
			eps = float64(in("epsilon").f[0])
		}
		for k, v := range x.f {
			d := float64(v)
			var r float64
			switch op.typ {
			case "silu":
				r = d / (1 + math.Exp(-d))
			case "relu":
				r = math.Max(d, 0)
			case "exp":
				r = math.Exp(d)
			case "sin":
				r = math.Sin(d)
			case "cos":
				r = math.Cos(d)
			case "gelu":
				r = 0.5 * d * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(d+0.044715*d*d*d)))
			case "rsqrt":
				r = 1 / math.Sqrt(d+eps)
			case "tanh":
				r = math.Tanh(d)
			case "identity":
				r = d
			}
			out.f[k] = float32(r)
		}
	case "cast":
		x := in("x")
		for k := range out.numel() {
			var v float64
			if x.DType == I32 {
				v = float64(x.i[k])
			} else {
				v = float64(x.f[k])
			}
			if out.DType == I32 {
				out.i[k] = int32(v)
			} else {
				out.f[k] = float32(v)
			}
		}
	case "select":
		c, a, b := in("cond"), in("a"), in("b")
		ic, ia, ib := bcastIndex(c.Shape, out.Shape), bcastIndex(a.Shape, out.Shape), bcastIndex(b.Shape, out.Shape)
		for k := range ic {
			src, j := b, ib[k]
			if c.b[ic[k]] {
				src, j = a, ia[k]
			}
			if out.f != nil {
				out.f[k] = src.f[j]
			} else if out.i != nil {
				out.i[k] = src.i[j]
			} else {
				out.b[k] = src.b[j]
			}
		}
	case "reduce_mean", "layer_norm", "softmax":
		rowsOp(op, in("x"), out, env)
	case "matmul":
		matmul(op, in("x"), in("y"), out, env)
	case "reshape", "squeeze", "expand_dims":
		x := in("x")
		copy(out.f, x.f)
		copy(out.i, x.i)
		copy(out.b, x.b)
	case "transpose":
		x := in("x")
		perm := env[op.inputs["perm"][0]].i
		xs := strides(x.Shape)
		coord := make([]int64, len(out.Shape))
		for k := range out.numel() {
			var o int64
			for d, p := range perm {
				o += coord[d] * xs[p]
			}
			copyElem(out, k, x, o)
			advance(coord, out.Shape)
		}
	case "slice_by_index":
		x := in("x")
		begin := env[op.inputs["begin"][0]].i
		xs := strides(x.Shape)
		coord := make([]int64, len(out.Shape))
		for k := range out.numel() {
			var o int64
			for d := range coord {
				o += (coord[d] + int64(begin[d])) * xs[d]
			}
			copyElem(out, k, x, o)
			advance(coord, out.Shape)
		}
	case "concat":
		a := int(env[op.inputs["axis"][0]].i[0])
		if a < 0 {
			a += len(out.Shape)
		}
		outer := numel(out.Shape[:a])
		inner := numel(out.Shape[a+1:])
		k := int64(0)
		for o := range outer {
			for _, name := range op.inputs["values"] {
				v := env[name]
				n := v.Shape[a] * inner
				for j := range n {
					copyElem(out, k, v, o*n+j)
					k++
				}
			}
		}
	case "gather":
		x, idx := in("x"), in("indices")
		a := 0
		if len(op.inputs["axis"]) > 0 {
			if a = int(env[op.inputs["axis"][0]].i[0]); a < 0 {
				a += len(x.Shape)
			}
		}
		outer, inner := numel(x.Shape[:a]), numel(x.Shape[a+1:])
		n := x.Shape[a]
		k := int64(0)
		for o := range outer {
			for _, id := range idx.i {
				if id < 0 || int64(id) >= n {
					return nil, fmt.Errorf("%w: gather index %d outside [0, %d)", ErrExecution, id, n)
				}
				for j := range inner {
					copyElem(out, k, x, (o*n+int64(id))*inner+j)
					k++
				}
			}
		}
	default:
		return nil, fmt.Errorf("%w: op %q has no executor", ErrExecution, op.typ)
	}
	return out, nil
}

func copyElem(dst *tensor, k int64, src *tensor, j int64) {
	switch {
	case dst.f != nil:
		dst.f[k] = src.f[j]
	case dst.i != nil:
		dst.i[k] = src.i[j]
	case dst.b != nil:
		dst.b[k] = src.b[j]
	}
}

func strides(s []int64) []int64 {
	st := make([]int64, len(s))
	acc := int64(1)
	for i := len(s) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= s[i]
	}
	return st
}

func advance(coord, shape []int64) {
	for i := len(shape) - 1; i >= 0; i-- {
		coord[i]++
		if coord[i] < shape[i] {
			return
		}
		coord[i] = 0
	}
}

// rowsOp runs the last-axis reductions (the checker admits only the last axis).
func rowsOp(op *operation, x, out *tensor, env map[string]*tensor) {
	k := x.Shape[len(x.Shape)-1]
	rows := x.numel() / k
	eps := 1e-5
	if op.typ == "layer_norm" && len(op.inputs["epsilon"]) > 0 {
		eps = float64(env[op.inputs["epsilon"][0]].f[0])
	}
	for r := range rows {
		row := x.f[r*k : (r+1)*k]
		switch op.typ {
		case "reduce_mean":
			s := 0.0
			for _, v := range row {
				s += float64(v)
			}
			out.f[r] = float32(s / float64(k))
		case "layer_norm":
			mean, vr := 0.0, 0.0
			for _, v := range row {
				mean += float64(v)
			}
			mean /= float64(k)
			for _, v := range row {
				vr += (float64(v) - mean) * (float64(v) - mean)
			}
			inv := 1 / math.Sqrt(vr/float64(k)+eps)
			for j, v := range row {
				out.f[r*k+int64(j)] = float32((float64(v) - mean) * inv)
			}
		case "softmax":
			mx := math.Inf(-1)
			for _, v := range row {
				mx = math.Max(mx, float64(v))
			}
			s := 0.0
			for _, v := range row {
				s += math.Exp(float64(v) - mx)
			}
			for j, v := range row {
				out.f[r*k+int64(j)] = float32(math.Exp(float64(v)-mx) / s)
			}
		}
	}
}

func matmul(op *operation, x, y, out *tensor, env map[string]*tensor) {
	ty := len(op.inputs["transpose_y"]) > 0 && env[op.inputs["transpose_y"][0]].b[0]
	k := x.Shape[len(x.Shape)-1]
	m := int64(1)
	if len(x.Shape) > 1 {
		m = x.Shape[len(x.Shape)-2]
	}
	n := out.Shape[len(out.Shape)-1]
	batchOut := out.Shape[:len(out.Shape)-min(2, len(out.Shape))]
	if len(x.Shape) == 1 {
		batchOut = out.Shape[:len(out.Shape)-1]
	}
	var xb []int64
	if len(x.Shape) > 2 {
		xb = x.Shape[:len(x.Shape)-2]
	}
	yb := y.Shape[:len(y.Shape)-2]
	ix, iy := bcastIndex(xb, batchOut), bcastIndex(yb, batchOut)
	yr, yc := y.Shape[len(y.Shape)-2], y.Shape[len(y.Shape)-1]
	for bi := range ix {
		xo, yo, oo := ix[bi]*m*k, iy[bi]*yr*yc, int64(bi)*m*n
		for i := range m {
			for j := range n {
				s := 0.0
				for p := range k {
					var yv float32
					if ty {
						yv = y.f[yo+j*yc+p]
					} else {
						yv = y.f[yo+p*yc+j]
					}
					s += float64(x.f[xo+i*k+p]) * float64(yv)
				}
				out.f[oo+i*n+j] = float32(s)
			}
		}
	}
}
