package abi

import (
	"context"
	"math"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

// The validation layer's precision check: an executable's first synchronous run is compared
// with the reference (core/ref) at the precision graph_analyze reported for its nodes.

// precisionRank orders precisions from widest (0) to narrowest, default counting as f32.
func precisionRank(p core.Precision) int {
	switch p {
	case core.PrecF16, core.PrecBF16:
		return 1
	case core.PrecInt8:
		return 2
	case core.PrecInt4:
		return 3
	}
	return 0
}

// precisionCheck is an executable's first run: its graph, its inputs as bound before the run,
// and where its outputs are.
type precisionCheck struct {
	exe    uint64
	g      *core.Graph
	prec   core.Precision
	inputs [][]byte
}

// claimCheck reports whether this run of e's execution is the one whose outputs are compared
// with the reference: the first synchronous run of an analyzed graph the adapter named, small
// enough for the reference, at a precision the check can judge.
func (v *Validator) claimCheck(e *vobj) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if e == nil || e.checked || e.graph == nil || !e.precOK {
		return false
	}
	e.checked = true
	if precisionRank(e.prec) >= 2 {
		return false // int8/int4: how close depends on the quantization, which OPS.md leaves open
	}
	total := uint64(0)
	for _, t := range e.graph.Tensors {
		total += uint64(max(t.Bytes(), 0))
	}
	return total <= precisionCheckMaxBytes
}

// ioBinding is one io's (buffer, offset); buffer 0 where it is not bound.
type ioBinding struct{ buf, off uint64 }

// bindings snapshots x's bindings.
func (v *Validator) bindings(x *vobj) []ioBinding {
	v.mu.Lock()
	defer v.mu.Unlock()
	bs := make([]ioBinding, len(x.binds))
	for i := range bs {
		bs[i] = ioBinding{x.binds[i], x.offsets[i]}
	}
	return bs
}

// readInputs reads the inputs of x's run before it; nil when an io is not bound (the plugin
// refuses such a run) or cannot be read.
func (v *Validator) readInputs(e *vobj, x *vobj) *precisionCheck {
	bs := v.bindings(x)
	pc := &precisionCheck{exe: x.exe, g: e.graph, prec: e.prec}
	for i, t := range e.graph.Inputs {
		if i >= len(bs) || bs[i].buf == 0 {
			return nil
		}
		buf := make([]byte, t.Bytes())
		if err := v.inner.BufferRead(bs[i].buf, bs[i].off, buf); err != nil {
			return nil
		}
		pc.inputs = append(pc.inputs, buf)
	}
	return pc
}

// comparePrecision reads the run's outputs and compares them with the reference's.
func (v *Validator) comparePrecision(ctx context.Context, pc *precisionCheck, x *vobj) error {
	want, err := ref.Run(ctx, pc.g, pc.inputs)
	if err != nil {
		return nil // a graph the reference cannot run: nothing to compare with
	}
	bs := v.bindings(x)
	limit := precisionLimit(pc.g, pc.prec)
	for i, t := range pc.g.Outputs {
		io := len(pc.g.Inputs) + i
		if io >= len(bs) || bs[io].buf == 0 || (t.DType != core.F32 && t.DType != core.F16 && t.DType != core.BF16) {
			continue
		}
		got := make([]byte, t.Bytes())
		if err := v.inner.BufferRead(bs[io].buf, bs[io].off, got); err != nil {
			return nil
		}
		nmse, finite := nmseOf(t.DType, got, want[i])
		if finite && nmse > limit {
			return v.violation("execution_run", RulePrecision, true,
				"output %d (%s) of executable %#x differs from the reference by NMSE %.3g, more than %.0e allowed at the reported precision %s: it computes at a lower precision than graph_analyze reported (or wrongly)",
				i, t.Name, pc.exe, nmse, limit, pc.prec)
		}
	}
	return nil
}

// precisionLimit is the NMSE a graph's outputs may have at the reported precision. f32
// arithmetic over a graph stays near 1e-12 of the reference; one f16 rounding of every value
// gives about 1e-7, so 1e-9 tells them apart. Where the graph's own dtypes are reduced (f16
// tensors, quantized weights, which OPS.md lets a backend pair with activations quantized on
// the fly) the limit is that of the reduced arithmetic.
func precisionLimit(g *core.Graph, prec core.Precision) float64 {
	if precisionRank(prec) == 1 {
		return 5e-3
	}
	for _, t := range g.Tensors {
		if t.DType != core.F32 && t.DType != core.I32 {
			return 5e-4
		}
	}
	for _, n := range g.Nodes {
		if n.Op == core.OpQuantize || n.Op == core.OpShadowMatMul || n.Op == core.OpSparseFFN {
			return 5e-4
		}
	}
	return 1e-9
}

// nmseOf is Σ(got−want)²/Σwant² over the finite elements (the plain sum of squares when want is
// all zeros); finite is false when either side has no finite element to compare.
func nmseOf(dt core.DType, got, want []byte) (float64, bool) {
	g, errG := core.Dequantize(dt, got, 0)
	w, errW := core.Dequantize(dt, want, 0)
	if errG != nil || errW != nil || len(g) != len(w) {
		return 0, false
	}
	var num, den float64
	n := 0
	for i := range g {
		gi, wi := float64(g[i]), float64(w[i])
		if math.IsNaN(wi) || math.IsInf(wi, 0) || math.IsNaN(gi) || math.IsInf(gi, 0) {
			continue
		}
		d := gi - wi
		num += d * d
		den += wi * wi
		n++
	}
	if n == 0 {
		return 0, false
	}
	if den == 0 {
		return num, true
	}
	return num / den, true
}
