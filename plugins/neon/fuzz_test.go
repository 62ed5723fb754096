package neon_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/core"
)

// IR layout constants (xpu_ir.h), to size a mutated graph's tensors before running it.
const (
	irHeader = 32
	irTensor = 64
	irNode   = 128
)

// irBytes is the total size of every tensor of blob, or -1 when the blob is not even that.
func irBytes(blob []byte) int64 {
	if len(blob) < irHeader {
		return -1
	}
	n := int64(binary.LittleEndian.Uint32(blob[12:]))
	if int64(len(blob)) < irHeader+n*irTensor {
		return -1
	}
	var total int64
	for i := int64(0); i < n; i++ {
		r := blob[irHeader+i*irTensor:]
		dt := core.DType(binary.LittleEndian.Uint32(r[0:]))
		elems := int64(1)
		for d := 0; d < 4; d++ {
			v := int64(binary.LittleEndian.Uint64(r[8+8*d:]))
			if v < 0 || v > 1<<20 {
				return -1
			}
			elems *= v
			if elems > 1<<26 {
				return -1
			}
		}
		total += dt.Bytes(elems) + 4*elems
	}
	return total
}

func fuzzSeeds(f *testing.F) {
	graphs := []func(g *core.Graph){
		func(g *core.Graph) {
			a := g.Input("a", core.F32, 3, 8)
			b := g.Input("b", core.F32, 5, 8)
			g.Output(g.Softmax(g.MatMul(a, b), 0.5))
		},
		func(g *core.Graph) {
			q := g.Input("q", core.F32, 2, 4, 8)
			k := g.Input("k", core.F16, 6, 2, 8)
			v := g.Input("v", core.F16, 6, 2, 8)
			g.Output(g.Attention(q, k, v, core.AttentionOptions{Causal: true, QOffset: 4}))
		},
		func(g *core.Graph) {
			x := g.Input("x", core.F32, 2, 64)
			q := g.Quantize(x, core.Q4_0, 0)
			ids := g.Input("ids", core.I32, 3)
			g.Output(g.GetRows(q, ids), g.Permute(g.Concat(0, x, x), 1, 0))
		},
		func(g *core.Graph) { // SPARSE_FFN: mutated idx values and bundle shapes reach the kernel
			x := g.Input("x", core.F32, 2, 32)
			b := g.Input("bundles", core.Q4_0, 6, 128)
			idx := g.Input("idx", core.I32, 4)
			g.Output(g.SparseFFN(x, b, idx, core.SparseFFNOptions{Act: core.SparseReLU2}))
		},
		func(g *core.Graph) {
			x := g.Input("x", core.F16, 40)
			b := g.Input("bundles", core.F32, 3, 85)
			g.Output(g.SparseFFN(x, b, g.Input("idx", core.I32, 5), core.SparseFFNOptions{Ungated: true, Act: core.SparseSiLU}))
		},
	}
	for _, build := range graphs {
		g := core.NewGraph()
		build(g)
		blob, err := abi.EncodeGraph(g, nil)
		require.NoError(f, err)
		f.Add(blob)
	}
}

// FuzzGraph feeds mutated IR to graph_analyze, graph_prepare and, when the graph prepares and
// stays small, to a run with every io bound: the plugin must answer with a status, never
// crash or write out of bounds.
func FuzzGraph(f *testing.F) {
	fuzzSeeds(f)
	// the first build that runs on this CPU (an AVX-512 build probes 0 elsewhere)
	var p *abi.Plugin
	var errs []error
	for _, file := range pluginFiles(f) {
		var err error
		if p, err = abi.Open(file); err == nil {
			break
		}
		errs = append(errs, err)
	}
	if p == nil {
		f.Skipf("no NEON build runs here: %v", errs)
	}
	f.Cleanup(func() { _ = p.Close() })
	ctx, st := p.ContextCreate(0, "threads=2")
	require.Equal(f, abi.StatusOK, st)
	f.Cleanup(func() { p.ContextRelease(ctx) })
	f.Fuzz(func(t *testing.T, data []byte) {
		blob := make([]byte, len(data)) // a fresh allocation is 8-byte aligned, as the IR wants
		copy(blob, data)
		if _, st := p.GraphAnalyze(ctx, blob, 64); st != abi.StatusOK {
			require.NotEmpty(t, p.LastError(ctx), "analyze failed with %s and no message", st)
		}
		exe, st := p.GraphPrepare(ctx, blob, "", nil)
		if st != abi.StatusOK {
			require.NotEmpty(t, p.LastError(ctx), "prepare failed with %s and no message", st)
			return
		}
		defer p.ExecutableRelease(exe)
		if size := irBytes(blob); size < 0 || size > 64<<20 {
			return
		}
		ex, st := p.ExecutionCreate(exe)
		if st != abi.StatusOK {
			return
		}
		defer p.ExecutionRelease(ex)
		buf, st := p.BufferAlloc(ctx, 1<<20, 0)
		require.Equal(t, abi.StatusOK, st)
		defer p.BufferRelease(buf)
		for io := uint32(0); ; io++ {
			if st := p.ExecutionBind(ex, io, buf, 0); st != abi.StatusOK {
				break
			}
		}
		_ = p.ExecutionRun(ex) // any status is fine; a crash is not
	})
}
