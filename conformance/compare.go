package conformance

import (
	"fmt"
	"math"

	"github.com/xpuhub/xpu/core"
)

// metrics is how one output compares with the reference.
type metrics struct {
	nmse, maxAbs, peak float64
	worst              int // index of the largest error
	nonFinite          string
	exactDiff          string // first difference when exactness is required
}

// decode turns a tensor's bytes into float64 values; I8 codes are multiplied by scale.
func decode(dt core.DType, b []byte, scale float32) ([]float64, error) {
	if dt == core.I32 {
		ints := core.DecodeI32(b)
		out := make([]float64, len(ints))
		for i, v := range ints {
			out[i] = float64(v)
		}
		return out, nil
	}
	if dt == core.I8 && scale == 0 {
		scale = 1
	}
	xs, err := core.Dequantize(dt, b, scale)
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out, nil
}

// f16MinNormal is binary16's smallest normal value: below it, half precision has no relative
// accuracy left to judge.
const f16MinNormal = 6.103515625e-05

// nmseFloor is the resolution NMSE's denominator is floored at for an output of dtype dt judged
// at precision prec: f16's smallest normal where the values pass through half precision, else 0.
// Without it a reference that is itself subnormal in f16 (GELU of a large negative scalar,
// 6e-8) makes any half-precision answer, even the exact-as-possible 0, an NMSE of 1.
func nmseFloor(dt core.DType, prec string) float64 {
	if dt == core.F16 || prec == core.PrecF16.String() {
		return f16MinNormal
	}
	return 0
}

// compareValues measures got against want. NaN/Inf parity is checked element by element:
// non-finite values where the reference is finite, or a different non-finite value, are
// reported in nonFinite and left out of NMSE and max-abs. NMSE's denominator is at least
// n·floor² (see nmseFloor).
func compareValues(got, want []float64, exact bool, floor float64) metrics {
	var m metrics
	var num, den float64
	for i := range want {
		w, g := want[i], got[i]
		wf, gf := !math.IsNaN(w) && !math.IsInf(w, 0), !math.IsNaN(g) && !math.IsInf(g, 0)
		switch {
		case !wf && math.IsNaN(w):
			if !math.IsNaN(g) && m.nonFinite == "" {
				m.nonFinite = fmt.Sprintf("element %d is %g, the reference is NaN", i, g)
			}
			continue
		case !wf:
			if g != w && m.nonFinite == "" {
				m.nonFinite = fmt.Sprintf("element %d is %g, the reference is %g", i, g, w)
			}
			continue
		case !gf:
			if m.nonFinite == "" {
				m.nonFinite = fmt.Sprintf("element %d is %g, the reference is %g", i, g, w)
			}
			continue
		}
		if exact && m.exactDiff == "" && (g != w || math.Signbit(g) != math.Signbit(w)) {
			m.exactDiff = fmt.Sprintf("element %d is %g, the reference is %g (bit-exact required)", i, g, w)
		}
		d := math.Abs(g - w)
		num += d * d
		den += w * w
		if d > m.maxAbs {
			m.maxAbs, m.worst = d, i
		}
		m.peak = max(m.peak, math.Abs(w))
	}
	den = max(den, float64(len(want))*floor*floor)
	if den > 0 {
		m.nmse = num / den
	} else {
		m.nmse = num
	}
	return m
}

// judge applies a threshold to one output's metrics and records failures on res.
func judge(res *CaseResult, output string, m metrics, got, want []float64, th Threshold) {
	if m.nonFinite != "" {
		res.fail(CatNaN, "%s: %s", output, m.nonFinite)
	}
	if th.Exact() {
		if m.exactDiff != "" {
			res.fail(CatMismatch, "%s: %s", output, m.exactDiff)
		}
		return
	}
	if m.nmse > th.NMSE {
		res.fail(CatMismatch, "%s: NMSE %.3g > %.3g", output, m.nmse, th.NMSE)
	}
	if lim := th.MaxAbs * max(1, m.peak); m.maxAbs > lim {
		res.fail(CatMismatch, "%s: max-abs %.3g > %.3g at element %d (got %g, want %g)", output,
			m.maxAbs, lim, m.worst, got[m.worst], want[m.worst])
	}
}

// outputScale is the scale an I8 output's codes are read with: QUANTIZE's fattr[0], else 1.
func outputScale(g *core.Graph, t *core.Tensor) float32 {
	if t.DType == core.I8 && t.Producer >= 0 && g.Nodes[t.Producer].Op == core.OpQuantize {
		return g.Nodes[t.Producer].FAttr[0]
	}
	return 1
}
