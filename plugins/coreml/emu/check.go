package emu

import (
	"fmt"
	"slices"

	"github.com/xpuhub/xpu/core"
	"google.golang.org/protobuf/encoding/protowire"
)

func protowireNum(n int) protowire.Number { return protowire.Number(n) }

func halfToF32(h uint16) float32 { return core.F16ToF32(h) }

func roundHalf(x float32) float32 { return core.F16ToF32(core.F32ToF16(x)) }

func f32ToHalf(x float32) uint16 { return core.F32ToF16(x) }

// param describes one parameter of a MIL operation.
type param struct {
	name     string
	required bool
	konst    bool // must be a compile-time constant (Core ML's compiler rejects a variable)
	variadic bool
}

// opSpec is what the checker knows about one MIL operation of the iOS 15/16 opsets: its
// parameters and its type rule.
type opSpec struct {
	params []param
	infer  func(c *opCtx) (Type, error)
}

// opCtx gives a type rule the types and constant values of an operation's arguments.
type opCtx struct {
	m    *Model
	typ  string
	args map[string][]string
}

func (c *opCtx) t(p string) Type        { return c.m.types[c.args[p][0]] }
func (c *opCtx) has(p string) bool      { return len(c.args[p]) > 0 }
func (c *opCtx) konst(p string) *tensor { return c.m.consts[c.args[p][0]] }
func (c *opCtx) errf(f string, a ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidModel, c.typ, fmt.Sprintf(f, a...))
}

func isFloat(d DType) bool { return d == F16 || d == F32 }

var (
	pX    = param{name: "x", required: true}
	pY    = param{name: "y", required: true}
	pAxis = param{name: "axis", required: true, konst: true}
)

func elementwise(dts ...DType) opSpec {
	return opSpec{params: []param{pX, pY}, infer: func(c *opCtx) (Type, error) {
		x, y := c.t("x"), c.t("y")
		if x.DType != y.DType || !slices.Contains(dts, x.DType) {
			return Type{}, c.errf("x %v and y %v: want one dtype of %v", x, y, dts)
		}
		s, err := broadcast(x.Shape, y.Shape)
		if err != nil {
			return Type{}, c.errf("%v", err)
		}
		if c.typ == "less_equal" {
			return Type{Bool, s}, nil
		}
		return Type{x.DType, s}, nil
	}}
}

func unaryFloat(extra ...param) opSpec {
	return opSpec{params: append([]param{pX}, extra...), infer: func(c *opCtx) (Type, error) {
		x := c.t("x")
		if !isFloat(x.DType) {
			return Type{}, c.errf("x is %v, want fp16 or fp32", x)
		}
		return x, nil
	}}
}

func broadcast(a, b []int64) ([]int64, error) {
	n := max(len(a), len(b))
	out := make([]int64, n)
	for i := range n {
		da, db := int64(1), int64(1)
		if j := len(a) - n + i; j >= 0 {
			da = a[j]
		}
		if j := len(b) - n + i; j >= 0 {
			db = b[j]
		}
		switch {
		case da == db || db == 1:
			out[i] = da
		case da == 1:
			out[i] = db
		default:
			return nil, fmt.Errorf("shapes %v and %v do not broadcast", a, b)
		}
	}
	return out, nil
}

// axisOf normalizes a (possibly negative) axis of rank r.
func axisOf(c *opCtx, p string, r int) (int, error) {
	k := c.konst(p)
	if k.DType != I32 || len(k.i) != 1 || len(k.Shape) != 0 {
		return 0, c.errf("%s must be an int32 scalar", p)
	}
	a := int(k.i[0])
	if a < 0 {
		a += r
	}
	if a < 0 || a >= r {
		return 0, c.errf("%s %d out of range for rank %d", p, k.i[0], r)
	}
	return a, nil
}

func intVec(c *opCtx, p string, n int) ([]int64, error) {
	k := c.konst(p)
	if k.DType != I32 || len(k.Shape) != 1 || (n >= 0 && len(k.i) != n) {
		return nil, c.errf("%s must be an int32 vector of length %d, is %v", p, n, k.Type)
	}
	out := make([]int64, len(k.i))
	for i, v := range k.i {
		out[i] = int64(v)
	}
	return out, nil
}

func boolScalar(c *opCtx, p string) (bool, error) {
	if !c.has(p) {
		return false, nil
	}
	k := c.konst(p)
	if k.DType != Bool || len(k.b) != 1 || len(k.Shape) != 0 {
		return false, c.errf("%s must be a bool scalar", p)
	}
	return k.b[0], nil
}

var specs = map[string]opSpec{
	"add":        elementwise(F16, F32, I32),
	"sub":        elementwise(F16, F32, I32),
	"mul":        elementwise(F16, F32, I32),
	"real_div":   elementwise(F16, F32),
	"less_equal": elementwise(F16, F32, I32),
	"logical_and": {params: []param{pX, pY}, infer: func(c *opCtx) (Type, error) {
		x, y := c.t("x"), c.t("y")
		if x.DType != Bool || y.DType != Bool {
			return Type{}, c.errf("x %v and y %v: want bool", x, y)
		}
		s, err := broadcast(x.Shape, y.Shape)
		if err != nil {
			return Type{}, c.errf("%v", err)
		}
		return Type{Bool, s}, nil
	}},
	"tanh": unaryFloat(),
	"silu": unaryFloat(),
	"relu": unaryFloat(),
	"exp":  unaryFloat(),
	"sin":  unaryFloat(),
	"cos":  unaryFloat(),
	"gelu": unaryFloat(param{name: "mode", konst: true}),
	"rsqrt": {params: []param{pX, {name: "epsilon", konst: true}}, infer: func(c *opCtx) (Type, error) {
		x := c.t("x")
		if !isFloat(x.DType) || c.has("epsilon") && c.t("epsilon").DType != x.DType {
			return Type{}, c.errf("x %v, epsilon of another type", x)
		}
		return x, nil
	}},
	"squeeze": {params: []param{pX, {name: "axes", konst: true}}, infer: func(c *opCtx) (Type, error) {
		x := c.t("x")
		if c.has("axes") {
			return Type{}, c.errf("only squeeze without axes is emulated")
		}
		s := []int64{}
		for _, d := range x.Shape {
			if d != 1 {
				s = append(s, d)
			}
		}
		return Type{x.DType, s}, nil
	}},
	"expand_dims": {params: []param{pX, {name: "axes", required: true, konst: true}}, infer: func(c *opCtx) (Type, error) {
		x := c.t("x")
		axes, err := intVec(c, "axes", -1)
		if err != nil {
			return Type{}, err
		}
		r := len(x.Shape) + len(axes)
		ins := map[int]bool{}
		for _, a := range axes {
			if a < 0 {
				a += int64(r)
			}
			if a < 0 || int(a) >= r || ins[int(a)] {
				return Type{}, c.errf("axes %v for rank %d", axes, len(x.Shape))
			}
			ins[int(a)] = true
		}
		s := make([]int64, 0, r)
		j := 0
		for i := range r {
			if ins[i] {
				s = append(s, 1)
			} else {
				s = append(s, x.Shape[j])
				j++
			}
		}
		return Type{x.DType, s}, nil
	}},
	"identity": {params: []param{pX}, infer: func(c *opCtx) (Type, error) { return c.t("x"), nil }},
	"cast": {params: []param{pX, {name: "dtype", required: true, konst: true}}, infer: func(c *opCtx) (Type, error) {
		x, d := c.t("x"), c.konst("dtype")
		if !slices.Contains([]DType{F16, F32, I32}, x.DType) {
			return Type{}, c.errf("x is %v: iOS 16 cast takes fp16, fp32 or int32", x)
		}
		to, ok := map[string]DType{"fp16": F16, "fp32": F32, "int32": I32}[d.s]
		if d.DType != Str || !ok {
			return Type{}, c.errf("dtype %q", d.s)
		}
		return Type{to, x.Shape}, nil
	}},
	"select": {params: []param{{name: "cond", required: true}, {name: "a", required: true}, {name: "b", required: true}},
		infer: func(c *opCtx) (Type, error) {
			cd, a, b := c.t("cond"), c.t("a"), c.t("b")
			if cd.DType != Bool || a.DType != b.DType {
				return Type{}, c.errf("cond %v, a %v, b %v", cd, a, b)
			}
			s, err := broadcast(cd.Shape, a.Shape)
			if err == nil {
				s, err = broadcast(s, b.Shape)
			}
			if err != nil {
				return Type{}, c.errf("%v", err)
			}
			return Type{a.DType, s}, nil
		}},
	"reduce_mean": {params: []param{pX, {name: "axes", konst: true}, {name: "keep_dims", konst: true}},
		infer: func(c *opCtx) (Type, error) {
			x := c.t("x")
			if !isFloat(x.DType) || !c.has("axes") {
				return Type{}, c.errf("x %v (float) and axes are required here", x)
			}
			axes, err := intVec(c, "axes", -1)
			if err != nil {
				return Type{}, err
			}
			keep, err := boolScalar(c, "keep_dims")
			if err != nil {
				return Type{}, err
			}
			red := map[int]bool{}
			for _, a := range axes {
				if a < 0 {
					a += int64(len(x.Shape))
				}
				if a < 0 || int(a) >= len(x.Shape) {
					return Type{}, c.errf("axis %d out of range", a)
				}
				red[int(a)] = true
			}
			var s []int64
			for i, d := range x.Shape {
				switch {
				case !red[i]:
					s = append(s, d)
				case keep:
					s = append(s, 1)
				}
			}
			return Type{x.DType, append([]int64{}, s...)}, nil
		}},
	"layer_norm": {params: []param{pX, {name: "axes", konst: true}, {name: "gamma", konst: true}, {name: "beta", konst: true}, {name: "epsilon", konst: true}},
		infer: func(c *opCtx) (Type, error) {
			x := c.t("x")
			if !isFloat(x.DType) || c.has("gamma") || c.has("beta") {
				return Type{}, c.errf("x %v; gamma/beta are not supported by this emulator", x)
			}
			if axes, err := intVec(c, "axes", 1); err != nil || (axes[0] != -1 && axes[0] != int64(len(x.Shape)-1)) {
				return Type{}, c.errf("only normalization over the last axis is emulated")
			}
			return x, nil
		}},
	"softmax": {params: []param{pX, {name: "axis", konst: true}}, infer: func(c *opCtx) (Type, error) {
		x := c.t("x")
		if !isFloat(x.DType) {
			return Type{}, c.errf("x %v", x)
		}
		if a, err := axisOf(c, "axis", len(x.Shape)); err != nil || a != len(x.Shape)-1 {
			return Type{}, c.errf("only softmax over the last axis is emulated")
		}
		return x, nil
	}},
	"matmul": {params: []param{pX, pY, {name: "transpose_x", konst: true}, {name: "transpose_y", konst: true}},
		infer: func(c *opCtx) (Type, error) {
			x, y := c.t("x"), c.t("y")
			tx, err := boolScalar(c, "transpose_x")
			if err != nil {
				return Type{}, err
			}
			ty, err := boolScalar(c, "transpose_y")
			if err != nil {
				return Type{}, err
			}
			if x.DType != y.DType || !isFloat(x.DType) || tx || len(x.Shape) < 1 || len(y.Shape) < 2 {
				return Type{}, c.errf("x %v y %v transpose_x %v: want equal float dtypes, rank >= 1 / >= 2, no transpose_x", x, y, tx)
			}
			m, k := int64(1), x.Shape[len(x.Shape)-1]
			if len(x.Shape) > 1 {
				m = x.Shape[len(x.Shape)-2]
			}
			yk, n := y.Shape[len(y.Shape)-2], y.Shape[len(y.Shape)-1]
			if ty {
				yk, n = n, yk
			}
			if yk != k {
				return Type{}, c.errf("inner dimensions %d and %d differ", k, yk)
			}
			var xb []int64
			if len(x.Shape) > 2 {
				xb = x.Shape[:len(x.Shape)-2]
			}
			batch, err := broadcast(xb, y.Shape[:len(y.Shape)-2])
			if err != nil {
				return Type{}, c.errf("%v", err)
			}
			s := append([]int64{}, batch...)
			if len(x.Shape) > 1 {
				s = append(s, m)
			}
			return Type{x.DType, append(s, n)}, nil
		}},
	"reshape": {params: []param{pX, {name: "shape", required: true, konst: true}}, infer: func(c *opCtx) (Type, error) {
		x := c.t("x")
		s, err := intVec(c, "shape", -1)
		if err != nil {
			return Type{}, err
		}
		t := Type{x.DType, s}
		for _, d := range s {
			if d <= 0 {
				return Type{}, c.errf("shape %v: only explicit positive dimensions are emulated", s)
			}
		}
		if t.numel() != x.numel() {
			return Type{}, c.errf("shape %v has %d elements, x %v has %d", s, t.numel(), x, x.numel())
		}
		return t, nil
	}},
	"transpose": {params: []param{pX, {name: "perm", required: true, konst: true}}, infer: func(c *opCtx) (Type, error) {
		x := c.t("x")
		perm, err := intVec(c, "perm", len(x.Shape))
		if err != nil {
			return Type{}, err
		}
		seen := map[int64]bool{}
		s := make([]int64, len(perm))
		for i, p := range perm {
			if p < 0 || int(p) >= len(x.Shape) || seen[p] {
				return Type{}, c.errf("perm %v is not a permutation", perm)
			}
			seen[p] = true
			s[i] = x.Shape[p]
		}
		return Type{x.DType, s}, nil
	}},
	"slice_by_index": {params: []param{pX, {name: "begin", required: true, konst: true}, {name: "end", required: true, konst: true}},
		infer: func(c *opCtx) (Type, error) {
			x := c.t("x")
			b, err := intVec(c, "begin", len(x.Shape))
			if err != nil {
				return Type{}, err
			}
			e, err := intVec(c, "end", len(x.Shape))
			if err != nil {
				return Type{}, err
			}
			s := make([]int64, len(b))
			for i := range b {
				if b[i] < 0 || e[i] > x.Shape[i] || b[i] >= e[i] {
					return Type{}, c.errf("[%d, %d) on a dimension of %d", b[i], e[i], x.Shape[i])
				}
				s[i] = e[i] - b[i]
			}
			return Type{x.DType, s}, nil
		}},
	"concat": {params: []param{{name: "values", required: true, variadic: true}, pAxis, {name: "interleave", konst: true}},
		infer: func(c *opCtx) (Type, error) {
			first := c.m.types[c.args["values"][0]]
			a, err := axisOf(c, "axis", len(first.Shape))
			if err != nil {
				return Type{}, err
			}
			if il, err := boolScalar(c, "interleave"); err != nil || il {
				return Type{}, c.errf("interleave is not emulated")
			}
			s := append([]int64{}, first.Shape...)
			s[a] = 0
			for _, v := range c.args["values"] {
				t := c.m.types[v]
				if t.DType != first.DType || len(t.Shape) != len(s) {
					return Type{}, c.errf("values %v and %v differ", first, t)
				}
				for i := range s {
					if i != a && t.Shape[i] != first.Shape[i] {
						return Type{}, c.errf("values %v and %v differ off the axis", first, t)
					}
				}
				s[a] += t.Shape[a]
			}
			return Type{first.DType, s}, nil
		}},
	"gather": {params: []param{pX, {name: "indices", required: true}, {name: "axis", konst: true}},
		infer: func(c *opCtx) (Type, error) {
			x, idx := c.t("x"), c.t("indices")
			if idx.DType != I32 || !slices.Contains([]DType{F16, F32, I32}, x.DType) {
				return Type{}, c.errf("x %v indices %v", x, idx)
			}
			a := 0
			if c.has("axis") {
				var err error
				if a, err = axisOf(c, "axis", len(x.Shape)); err != nil {
					return Type{}, err
				}
			}
			s := append(append(append([]int64{}, x.Shape[:a]...), idx.Shape...), x.Shape[a+1:]...)
			return Type{x.DType, s}, nil
		}},
}

// parseOp parses and checks one operation; its output is defined afterwards.
func (m *Model) parseOp(b []byte, blobs map[string][]byte, readBlob func(string) ([]byte, error)) (operation, error) {
	f, err := parseFields(b)
	if err != nil {
		return operation{}, err
	}
	op := operation{typ: f.str(opType), inputs: map[string][]string{}}
	if len(f.all(opBlocks)) > 0 {
		return op, fmt.Errorf("%w: %s: nested blocks are not supported", ErrInvalidModel, op.typ)
	}
	outs := f.all(opOutputs)
	if len(outs) != 1 {
		return op, fmt.Errorf("%w: %s: %d outputs, the emulated ops have one", ErrInvalidModel, op.typ, len(outs))
	}
	if op.out, op.outT, err = namedType(outs[0].b); err != nil {
		return op, err
	}
	ins, _, err := f.mapEntries(opInputs)
	if err != nil {
		return op, err
	}
	for p, a := range ins {
		for _, bf := range a.all(1) {
			bind, err := parseFields(bf.b)
			if err != nil {
				return op, err
			}
			nf, ok := bind.last(1)
			if !ok {
				return op, fmt.Errorf("%w: %s.%s: only bindings by name are supported", ErrInvalidModel, op.typ, p)
			}
			name := string(nf.b)
			if _, ok := m.types[name]; !ok {
				return op, fmt.Errorf("%w: %s.%s: %q is not defined before its use", ErrInvalidModel, op.typ, p, name)
			}
			op.inputs[p] = append(op.inputs[p], name)
		}
	}
	if op.typ == "const" {
		if len(ins) != 0 {
			return op, fmt.Errorf("%w: const with inputs", ErrInvalidModel)
		}
		attrs, _, err := f.mapEntries(opAttrs)
		if err != nil {
			return op, err
		}
		vf, ok := attrs["val"]
		if !ok {
			return op, fmt.Errorf("%w: const %q has no val attribute", ErrInvalidModel, op.out)
		}
		raw := msgBytes(vf)
		if op.val, err = constValue(raw, op.outT, blobs, readBlob); err != nil {
			return op, fmt.Errorf("const %q: %w", op.out, err)
		}
		m.consts[op.out] = op.val
		return op, m.define(op.out, op.outT)
	}
	spec, ok := specs[op.typ]
	if !ok {
		return op, fmt.Errorf("%w: %q is not an operation of opset %s this emulator knows", ErrInvalidModel, op.typ, m.Opset)
	}
	for p, names := range op.inputs {
		i := slices.IndexFunc(spec.params, func(q param) bool { return q.name == p })
		if i < 0 {
			return op, fmt.Errorf("%w: %s has no parameter %q", ErrInvalidModel, op.typ, p)
		}
		q := spec.params[i]
		if len(names) != 1 && !q.variadic || len(names) == 0 {
			return op, fmt.Errorf("%w: %s.%s bound to %d values", ErrInvalidModel, op.typ, p, len(names))
		}
		if q.konst {
			if _, ok := m.consts[names[0]]; !ok {
				return op, fmt.Errorf("%w: %s.%s must be a compile-time constant", ErrInvalidModel, op.typ, p)
			}
		}
	}
	for _, q := range spec.params {
		if q.required && len(op.inputs[q.name]) == 0 {
			return op, fmt.Errorf("%w: %s lacks required parameter %q", ErrInvalidModel, op.typ, q.name)
		}
	}
	t, err := spec.infer(&opCtx{m: m, typ: op.typ, args: op.inputs})
	if err != nil {
		return op, err
	}
	if !t.equal(op.outT) {
		return op, fmt.Errorf("%w: %s %q declares %v, its inputs give %v", ErrInvalidModel, op.typ, op.out, op.outT, t)
	}
	return op, m.define(op.out, op.outT)
}

// msgBytes re-encodes parsed fields (the const's Value) so constValue can parse it as a whole.
func msgBytes(fs fields) []byte {
	var b []byte
	for _, f := range fs {
		b = protowire.AppendTag(b, f.num, f.typ)
		switch f.typ {
		case protowire.VarintType:
			b = protowire.AppendVarint(b, f.v)
		case protowire.Fixed32Type:
			b = protowire.AppendFixed32(b, uint32(f.v))
		case protowire.Fixed64Type:
			b = protowire.AppendFixed64(b, f.v)
		case protowire.BytesType:
			b = protowire.AppendBytes(b, f.b)
		}
	}
	return b
}
