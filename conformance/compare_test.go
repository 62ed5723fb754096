package conformance

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/xpuhub/xpu/core"
)

func TestCompareAndJudge(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	loose := Threshold{NMSE: 1e-6, MaxAbs: 1e-3}
	exact := Threshold{}
	tests := []struct {
		name      string
		got, want []float64
		th        Threshold
		cat       Category // CatNone: passes
	}{
		{"equal", []float64{1, 2, 3}, []float64{1, 2, 3}, loose, CatNone},
		{"within", []float64{1, 2, 3.000001}, []float64{1, 2, 3}, loose, CatNone},
		{"nmse over", []float64{1.01, 2, 3}, []float64{1, 2, 3}, loose, CatMismatch},
		{"one bad element in many", append(make([]float64, 9999), 0.5), append(make([]float64, 9999), 0.49), loose, CatMismatch},
		{"nan where finite", []float64{1, nan}, []float64{1, 2}, loose, CatNaN},
		{"inf where finite", []float64{inf, 2}, []float64{1, 2}, loose, CatNaN},
		{"nan parity", []float64{nan, 2}, []float64{nan, 2}, loose, CatNone},
		{"inf parity", []float64{inf}, []float64{inf}, exact, CatNone},
		{"wrong inf sign", []float64{-inf}, []float64{inf}, loose, CatNaN},
		{"finite where nan", []float64{0}, []float64{nan}, loose, CatNaN},
		{"exact equal", []float64{1.5, -2}, []float64{1.5, -2}, exact, CatNone},
		{"exact off by an ulp", []float64{math.Nextafter(1, 2)}, []float64{1}, exact, CatMismatch},
		{"exact signed zero", []float64{math.Copysign(0, -1)}, []float64{0}, exact, CatMismatch},
		{"all-zero reference", []float64{0, 1e-2}, []float64{0, 0}, loose, CatMismatch},
		{"empty", nil, nil, exact, CatNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := CaseResult{Status: StatusPass}
			m := compareValues(tt.got, tt.want, tt.th.Exact(), 0)
			judge(&res, "out", m, tt.got, tt.want, tt.th)
			assert.Equal(t, tt.cat, res.Category, "errors: %v", res.Errors)
			if tt.cat == CatNone {
				assert.Equal(t, StatusPass, res.Status)
			} else {
				assert.Equal(t, StatusFail, res.Status)
			}
		})
	}
}

func TestFailKeepsTheMostSevereCategory(t *testing.T) {
	res := CaseResult{Status: StatusPass}
	res.fail(CatMismatch, "a")
	res.fail(CatOutOfBounds, "b")
	res.fail(CatNondeterministic, "c")
	res.fail(CatNondeterministic, "c")
	assert.Equal(t, CatOutOfBounds, res.Category)
	assert.Equal(t, []string{"a", "b", "c"}, res.Errors)
}

func TestCaseNamesAreUniqueAndSeeded(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range allCases() {
		assert.False(t, seen[c.name], "duplicate case %s", c.name)
		seen[c.name] = true
	}
	a, b := caseRand("ADD(x)", 1), caseRand("ADD(x)", 1)
	assert.Equal(t, a.Uint64(), b.Uint64(), "same name and seed, same inputs")
	assert.NotEqual(t, caseRand("ADD(x)", 1).Uint64(), caseRand("ADD(x)", 2).Uint64())
	assert.NotEqual(t, caseRand("ADD(x)", 1).Uint64(), caseRand("ADD(y)", 1).Uint64())
}

// The f16 resolution floor: a reference that is subnormal in f16 cannot fail a half-precision
// answer by NMSE, but a normal-range error still fails.
func TestNMSEFloor(t *testing.T) {
	loose := Threshold{NMSE: 1e-4, MaxAbs: 4e-3}
	tests := []struct {
		name      string
		got, want []float64
		floor     float64
		cat       Category
	}{
		{"subnormal reference, no floor", []float64{0}, []float64{6e-8}, 0, CatMismatch},
		{"subnormal reference, f16 floor", []float64{0}, []float64{6e-8}, nmseFloor(core.F16, "default"), CatNone},
		{"f16 precision floors an f32 output", []float64{0}, []float64{6e-8}, nmseFloor(core.F32, "f16"), CatNone},
		{"f32 at f32 precision has no floor", []float64{0}, []float64{6e-8}, nmseFloor(core.F32, "f32"), CatMismatch},
		{"floor keeps normal-range errors", []float64{0.5}, []float64{0.49}, f16MinNormal, CatMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := CaseResult{Status: StatusPass}
			m := compareValues(tt.got, tt.want, false, tt.floor)
			judge(&res, "out", m, tt.got, tt.want, loose)
			assert.Equal(t, tt.cat, res.Category, "%v", res.Errors)
		})
	}
}
