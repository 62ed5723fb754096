package conformance

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"

	"github.com/xpuhub/xpu/core"
)

// caseRand is the random source of one case: a hash of its name and the run's seed, so a case
// gets the same inputs whatever else runs and the printed seed reproduces it.
func caseRand(name string, seed uint64) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	return rand.New(rand.NewPCG(h.Sum64(), seed))
}

// builder collects a case's graph and the bytes of its inputs, in graph input order.
type builder struct {
	g      *core.Graph
	r      *rand.Rand
	inputs [][]byte
	err    error
}

func newBuilder(r *rand.Rand) *builder { return &builder{g: core.NewGraph(), r: r} }

func (b *builder) uniform(n int64, lo, hi float32) []float32 {
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = lo + (hi-lo)*b.r.Float32()
	}
	return xs
}

// encode turns values into dt's bytes; I8 values are taken as codes (clamped to ±127), other
// dtypes go through core.Quantize.
func (b *builder) encode(dt core.DType, xs []float32) []byte {
	if dt == core.I32 {
		ints := make([]int32, len(xs))
		for i, x := range xs {
			ints[i] = int32(x)
		}
		return core.EncodeI32(ints)
	}
	if dt == core.I8 {
		out := make([]byte, len(xs))
		for i, x := range xs {
			out[i] = byte(int8(max(-127, min(127, x))))
		}
		return out
	}
	data, err := core.Quantize(dt, xs, 0)
	if err != nil && b.err == nil {
		b.err = fmt.Errorf("encode %s: %w", dt, err)
	}
	return data
}

// randomData draws a tensor's values: U[lo,hi] for floats and block types, integer codes
// U[-127,127] for I8, integers in [lo,hi) for I32.
func (b *builder) randomData(dt core.DType, shape core.Shape, lo, hi float32) []byte {
	n := shape.NumElements()
	switch dt {
	case core.I8:
		return b.encode(dt, b.uniform(n, -127.49, 127.49))
	case core.I32:
		ints := make([]int32, n)
		for i := range ints {
			ints[i] = int32(lo) + int32(b.r.IntN(max(1, int(hi-lo))))
		}
		return core.EncodeI32(ints)
	}
	return b.encode(dt, b.uniform(n, lo, hi))
}

// in adds a graph input with random values in [lo, hi].
func (b *builder) in(name string, dt core.DType, shape core.Shape, lo, hi float32) *core.Tensor {
	return b.inData(name, dt, shape, b.randomData(dt, shape, lo, hi))
}

// inData adds a graph input with the given bytes.
func (b *builder) inData(name string, dt core.DType, shape core.Shape, data []byte) *core.Tensor {
	t := b.g.Input(name, dt, shape...)
	b.inputs = append(b.inputs, data)
	return t
}

// cnst adds a constant (a weight) with random values in [lo, hi].
func (b *builder) cnst(name string, dt core.DType, shape core.Shape, lo, hi float32) *core.Tensor {
	return b.g.Const(name, dt, shape, b.randomData(dt, shape, lo, hi))
}

// done returns the graph and inputs, or the first error met while building.
func (b *builder) done() (*core.Graph, [][]byte, error) {
	if b.err != nil {
		return nil, nil, b.err
	}
	if err := b.g.Err(); err != nil {
		return nil, nil, err
	}
	return b.g, b.inputs, nil
}
