package abi

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
)

// IR layout constants, as in xpu_ir.h.
const (
	IRMagic      = 0x47555058 // "XPUG"
	IRVersion    = 1
	irHeaderSize = 32
	irTensorSize = 64
	irNodeSize   = 128
	irNoTensor   = 0xFFFFFFFF
)

// ConstRef locates a constant tensor's bytes in a backend buffer of the context the graph is
// prepared in.
type ConstRef struct {
	Buffer uint64 // the plugin's buffer handle
	Offset uint64
}

// EncodeGraph writes g in the binary IR of xpu_ir.h. constRef gives the (buffer, offset) of
// every constant; it is called once per constant tensor. The result is 8-byte aligned when
// allocated by Go (the C reader requires it).
func EncodeGraph(g *core.Graph, constRef func(*core.Tensor) (ConstRef, error)) ([]byte, error) {
	if err := g.Err(); err != nil {
		return nil, err
	}
	size := irHeaderSize + len(g.Tensors)*irTensorSize + len(g.Nodes)*irNodeSize +
		4*(len(g.Inputs)+len(g.Outputs))
	// a []uint64 backing array guarantees the 8-byte alignment the C reader checks
	words := make([]uint64, (size+7)/8)
	b := unsafeBytes(words)[:size]
	le := binary.LittleEndian

	le.PutUint32(b[0:], IRMagic)
	le.PutUint32(b[4:], IRVersion)
	le.PutUint32(b[8:], g.Opset())
	le.PutUint32(b[12:], uint32(len(g.Tensors)))
	le.PutUint32(b[16:], uint32(len(g.Nodes)))
	le.PutUint32(b[20:], uint32(len(g.Inputs)))
	le.PutUint32(b[24:], uint32(len(g.Outputs)))

	off := irHeaderSize
	for _, t := range g.Tensors {
		r := b[off : off+irTensorSize]
		if len(t.Shape) > core.MaxRank {
			return nil, fmt.Errorf("abi: tensor %s: rank %d > %d: %w", t.Name, len(t.Shape), core.MaxRank, core.ErrGraph)
		}
		le.PutUint32(r[0:], uint32(t.DType))
		le.PutUint32(r[4:], uint32(len(t.Shape)))
		for d := 0; d < core.MaxRank; d++ {
			v := int64(1)
			if d < len(t.Shape) {
				v = t.Shape[d]
			}
			le.PutUint64(r[8+8*d:], uint64(v))
		}
		le.PutUint32(r[40:], uint32(t.Kind))
		if t.Kind == core.KindConst {
			if constRef == nil {
				return nil, fmt.Errorf("abi: constant %s has no buffer: %w", t.Name, core.ErrInvalidArgument)
			}
			ref, err := constRef(t)
			if err != nil {
				return nil, fmt.Errorf("abi: constant %s: %w", t.Name, err)
			}
			le.PutUint64(r[48:], ref.Buffer)
			le.PutUint64(r[56:], ref.Offset)
		}
		off += irTensorSize
	}
	for _, n := range g.Nodes {
		r := b[off : off+irNodeSize]
		if len(n.Inputs) > core.MaxInputs {
			return nil, fmt.Errorf("abi: %s: %d inputs > %d: %w", n, len(n.Inputs), core.MaxInputs, core.ErrGraph)
		}
		le.PutUint32(r[0:], uint32(n.Op))
		le.PutUint32(r[4:], uint32(len(n.Inputs)))
		for i := 0; i < core.MaxInputs; i++ {
			v := uint32(irNoTensor)
			if i < len(n.Inputs) {
				v = uint32(n.Inputs[i].ID)
			}
			le.PutUint32(r[8+4*i:], v)
		}
		le.PutUint32(r[40:], uint32(n.Output.ID))
		for i, v := range n.IAttr {
			le.PutUint64(r[48+8*i:], uint64(v))
		}
		for i, v := range n.FAttr {
			le.PutUint32(r[112+4*i:], math.Float32bits(v))
		}
		off += irNodeSize
	}
	for _, t := range g.Inputs {
		le.PutUint32(b[off:], uint32(t.ID))
		off += 4
	}
	for _, t := range g.Outputs {
		le.PutUint32(b[off:], uint32(t.ID))
		off += 4
	}
	return b, nil
}
