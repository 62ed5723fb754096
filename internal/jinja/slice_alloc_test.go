package jinja

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// measure compares the allocations of two templates rendered with the
// same data. Returns (with - without) — the cost attributable to the
// extra slice expression.
func measure(t *testing.T, withExpr, withoutExpr string, items int) (delta float64) {
	t.Helper()

	mk := func(src string) *Template {
		tmpl, err := Compile(src)
		if err != nil {
			t.Fatal(err)
		}
		return tmpl
	}

	xs := make([]any, items)
	for i := range xs {
		xs[i] = i
	}
	data := map[string]any{"items": xs}

	with := mk(withExpr)
	without := mk(withoutExpr)

	for range 5 {
		_, _ = with.Render(data)
		_, _ = without.Render(data)
	}

	a := testing.AllocsPerRun(2000, func() {
		_, _ = with.Render(data)
	})
	b := testing.AllocsPerRun(2000, func() {
		_, _ = without.Render(data)
	})
	t.Logf("with=%.2f without=%.2f delta=%.2f", a, b, a-b)
	return a - b
}

// A slice costs at most three allocations over the same template without it (the []Value
// backing array, the *List wrapper and one spare): the step-1 fast path, and the general step
// path and a negative start because their result is sized up front (no append growth).
func TestEvalSliceAllocs(t *testing.T) {
	for _, tc := range []struct{ name, withExpr string }{
		{"step 1", `{% set tail = items[1:] %}{{ tail|length }}`},
		{"step 2, pre-sized", `{% set evens = items[0:64:2] %}{{ evens|length }}`},
		{"negative start", `{% set tail = items[-10:] %}{{ tail|length }}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			delta := measure(t, tc.withExpr, `{{ items|length }}`, 64)
			assert.LessOrEqual(t, delta, 3.0, "allocations the slice adds")
		})
	}
}

// Lists, ASCII strings and other strings slice alike, in Python's sense, for every step.
func TestSliceSteps(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{`l[1:]|join`, "bcde"},
		{`l[-2:]|join`, "de"},
		{`l[3:1]|join`, ""},
		{`l[::2]|join`, "ace"},
		{`l[::-1]|join`, "edcba"},
		{`l[3::-2]|join`, "db"},
		{`l[-1:0:-1]|join`, "edcb"},
		{`l[10:]|join`, ""},
		{`s[1:]`, "bcde"},
		{`s[::2]`, "ace"},
		{`s[::-1]`, "edcba"},
		{`s[3::-2]`, "db"},
		{`s[-3:-1]`, "cd"},
		{`u[1:]`, "éçdé"},
		{`u[::-1]`, "édçéa"},
		{`u[::2]`, "açé"},
		{`u[-2:]`, "dé"},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			tmpl, err := Compile("{{ " + tc.expr + " }}")
			require.NoError(t, err)
			got, err := tmpl.Render(map[string]any{
				"l": []any{"a", "b", "c", "d", "e"}, "s": "abcde", "u": "aéçdé"})
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
