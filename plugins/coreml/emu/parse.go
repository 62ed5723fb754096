// Package emu is an EMULATED Core ML runtime for machines without Core ML (Linux CI). It reads
// an .mlpackage from disk, parses the protobuf specification on its own (it shares no code with
// the writer in package coreml), checks it against the rules Core ML's compiler enforces for the
// MIL operations it knows (types, shapes, operation and parameter names, compile-time constant
// parameters, weight blob offsets, specification version against opset and feature types) and
// executes it with its own float32 implementation of those operations (f16 values rounded to
// binary16 after every operation, as a typed f16 program would). It is not Apple's Core ML:
// passing here shows the package is well-formed by these rules and computes the right thing, not
// that a real Core ML compiler accepts it or how fast a device runs it.
package emu

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// ErrInvalidModel is wrapped by every error about a malformed or rule-breaking package.
var ErrInvalidModel = errors.New("coreml emulator: invalid model")

// field is one decoded protobuf field.
type field struct {
	num protowire.Number
	typ protowire.Type
	v   uint64
	b   []byte
}

type fields []field

// parseFields decodes one message level.
func parseFields(b []byte) (fields, error) {
	var out fields
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("%w: bad tag: %v", ErrInvalidModel, protowire.ParseError(n))
		}
		b = b[n:]
		f := field{num: num, typ: typ}
		switch typ {
		case protowire.VarintType:
			f.v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var v uint32
			v, n = protowire.ConsumeFixed32(b)
			f.v = uint64(v)
		case protowire.Fixed64Type:
			f.v, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			f.b, n = protowire.ConsumeBytes(b)
		default:
			return nil, fmt.Errorf("%w: unsupported wire type %d", ErrInvalidModel, typ)
		}
		if n < 0 {
			return nil, fmt.Errorf("%w: field %d: %v", ErrInvalidModel, num, protowire.ParseError(n))
		}
		b = b[n:]
		out = append(out, f)
	}
	return out, nil
}

func (fs fields) all(num protowire.Number) []field {
	var out []field
	for _, f := range fs {
		if f.num == num {
			out = append(out, f)
		}
	}
	return out
}

// last is the last occurrence (protobuf's rule for a singular field).
func (fs fields) last(num protowire.Number) (field, bool) {
	for i := len(fs) - 1; i >= 0; i-- {
		if fs[i].num == num {
			return fs[i], true
		}
	}
	return field{}, false
}

func (fs fields) msg(num protowire.Number) (fields, bool, error) {
	f, ok := fs.last(num)
	if !ok {
		return nil, false, nil
	}
	if f.typ != protowire.BytesType {
		return nil, false, fmt.Errorf("%w: field %d is not a message", ErrInvalidModel, num)
	}
	sub, err := parseFields(f.b)
	return sub, true, err
}

func (fs fields) str(num protowire.Number) string {
	f, _ := fs.last(num)
	return string(f.b)
}

func (fs fields) uint(num protowire.Number) uint64 {
	f, _ := fs.last(num)
	return f.v
}

// mapEntries decodes a map<string, message> field.
func (fs fields) mapEntries(num protowire.Number) (map[string]fields, []string, error) {
	out := map[string]fields{}
	var order []string
	for _, f := range fs.all(num) {
		e, err := parseFields(f.b)
		if err != nil {
			return nil, nil, err
		}
		k := e.str(1)
		if _, dup := out[k]; dup {
			return nil, nil, fmt.Errorf("%w: duplicate map key %q", ErrInvalidModel, k)
		}
		v, _, err := e.msg(2)
		if err != nil {
			return nil, nil, err
		}
		out[k] = v
		order = append(order, k)
	}
	return out, order, nil
}

// packed decodes a packed (or unpacked) repeated scalar field of the given wire type.
func (fs fields) packed(num protowire.Number, fixed32 bool) ([]uint64, error) {
	var out []uint64
	for _, f := range fs.all(num) {
		if f.typ != protowire.BytesType {
			out = append(out, f.v)
			continue
		}
		b := f.b
		for len(b) > 0 {
			var v uint64
			var n int
			if fixed32 {
				var u uint32
				u, n = protowire.ConsumeFixed32(b)
				v = uint64(u)
			} else {
				v, n = protowire.ConsumeVarint(b)
			}
			if n < 0 {
				return nil, fmt.Errorf("%w: packed field %d: %v", ErrInvalidModel, num, protowire.ParseError(n))
			}
			out = append(out, v)
			b = b[n:]
		}
	}
	return out, nil
}
