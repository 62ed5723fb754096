package jinja

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// max and min pick by value, the first of equals, and give nothing for an empty list or a
// non-list.
func TestFilterMaxMin(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{`[3, 1, 2]|max`, "3"},
		{`[3, 1, 2]|min`, "1"},
		{`[1.5, 2, -1]|max`, "2"},
		{`[1.5, 2, -1]|min`, "-1"},
		{`["b", "c", "a"]|max`, "c"},
		{`["b", "c", "a"]|min`, "a"},
		{`["1.0", 1]|max`, "1.0"},
		{`[1, "1.0"]|max`, "1"},
		{`["1.0", 1]|min`, "1.0"},
		{`[1, "1.0"]|min`, "1"},
		{`[]|max`, ""},
		{`[]|min`, ""},
		{`5|max`, ""},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			tmpl, err := Compile("{{ " + tc.expr + " }}")
			require.NoError(t, err)
			got, err := tmpl.Render(nil)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
