package conformance

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTolerancesCoverEveryCase(t *testing.T) {
	tol, err := DefaultTolerances()
	require.NoError(t, err)
	for _, row := range tol {
		assert.NotEmpty(t, row.Reason, "row %s/%s/%s", row.Op, row.DType, row.Precision)
	}
	for _, c := range allCases() {
		if c.level < 2 || c.level > 4 {
			continue
		}
		for _, prec := range []string{"default", "f32", "f16", "bf16", "int8", "int4"} {
			_, ok := tol.Lookup(c.op, c.dtype, prec)
			assert.True(t, ok, "no TOLERANCES.md row for %s (op %s, dtype %s, precision %s)", c.name, c.op, c.dtype, prec)
		}
	}
}

// TestTolerancesHaveNoCatchAll: a row matching every op made the coverage test above unable to
// fail. Every op pattern must name ops (GRAPH:* names the graph cases only), and an op the
// table does not name (planted: FOO) must find no row.
func TestTolerancesHaveNoCatchAll(t *testing.T) {
	tol, err := DefaultTolerances()
	require.NoError(t, err)
	for _, row := range tol {
		for _, p := range strings.Split(row.Op, ",") {
			p = strings.TrimSpace(p)
			assert.False(t, matchAny(p, "FOO") || matchAny(p, "MODEL"),
				"row %s | %s | %s matches any op", row.Op, row.DType, row.Precision)
		}
	}
	for _, dt := range []string{"f32", "f16", "q8_0", "f32/f32"} {
		for _, prec := range []string{"default", "f16", "int8"} {
			_, ok := tol.Lookup("FOO", dt, prec)
			assert.False(t, ok, "an unknown op found a row (%s, %s)", dt, prec)
		}
	}
	for _, op := range []string{"ADD", "SUB", "MUL", "DIV", "SILU", "GELU", "EXP", "SCALE", "NEG", "RELU"} {
		_, ok := tol.Lookup(op, "f32", "default")
		assert.True(t, ok, "elementwise %s", op)
	}
}

func TestToleranceLookup(t *testing.T) {
	tol, err := DefaultTolerances()
	require.NoError(t, err)
	tests := []struct {
		op, dtype, prec string
		exact           bool
		nmse            float64
	}{
		{"PERMUTE", "f32", "default", true, 0},
		{"CAST", "f32>f16", "default", true, 0},
		{"MATMUL", "f32/q4_0", "default", false, 5e-4},
		{"MATMUL", "f32/f32", "default", false, 1e-6},
		{"MATMUL", "f32/f32", "f16", false, 5e-4},
		{"SOFTMAX", "f32", "default", false, 1e-7},
		{"SOFTMAX", "f16", "default", false, 1e-5},
		{"ADD", "f32", "default", false, 1e-7},
		{"GRAPH:transformer-block", "q8_0", "default", false, 1e-3},
	}
	for _, tt := range tests {
		t.Run(tt.op+"/"+tt.dtype+"/"+tt.prec, func(t *testing.T) {
			th, ok := tol.Lookup(tt.op, tt.dtype, tt.prec)
			require.True(t, ok)
			assert.Equal(t, tt.exact, th.Exact())
			assert.Equal(t, tt.nmse, th.NMSE)
		})
	}
}

func TestParseTolerancesErrors(t *testing.T) {
	header := "| op | dtype | precision | nmse | max_abs | reason |\n|---|---|---|---|---|---|\n"
	tests := []struct {
		name, md, want string
	}{
		{"no table", "# nothing here\n", "no threshold table"},
		{"short row", header + "| ADD | f32 | * | 1e-7 |\n", "cells"},
		{"bad nmse", header + "| ADD | f32 | * | tiny | 0 | r |\n", "nmse"},
		{"negative max_abs", header + "| ADD | f32 | * | 0 | -1 | r |\n", "max_abs"},
		{"no reason", header + "| ADD | f32 | * | 0 | 0 |  |\n", "reason"},
		{"bad pattern", header + "| [ADD | f32 | * | 0 | 0 | r |\n", "pattern"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseTolerances(tt.md)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	tol, err := ParseTolerances("intro\n\n" + header + "| A,B | f32/* | * | 1e-3 | 0.5 | why |\n\nafter | not a row\n")
	require.NoError(t, err)
	require.Len(t, tol, 1)
	_, ok := tol.Lookup("B", "f32/q8_0", "f16")
	assert.True(t, ok, "',' lists and '/' inside a label")
	_, ok = tol.Lookup("C", "f32/q8_0", "f16")
	assert.False(t, ok)
}

func FuzzParseTolerances(f *testing.F) {
	f.Add(tolerancesMD)
	f.Add("| op | dtype | precision | nmse | max_abs | reason |\n|---|\n| * | * | * | 1 | 1 | r |\n")
	f.Add("|||\n|")
	f.Fuzz(func(t *testing.T, md string) {
		tol, err := ParseTolerances(md)
		if err != nil {
			return
		}
		require.NotEmpty(t, tol)
		for _, row := range tol {
			require.GreaterOrEqual(t, row.NMSE, 0.0)
			require.NotEmpty(t, strings.TrimSpace(row.Reason))
			tol.Lookup(row.Op, row.DType, row.Precision) // must not panic
		}
	})
}
