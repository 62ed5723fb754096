package jinja

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An unclosed tag is reported at its own line and column, counted across text, quoted
// strings and escaped characters (an escaped newline is one line).
func TestScanUnclosedTagPosition(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"expression", "ab\n  {{ x", "unclosed expression tag at line 2, col 3"},
		{"statement", "{% if x %}\n{% endif", "unclosed statement tag at line 2, col 1"},
		{"comment", "{# a\nb", "unclosed comment tag at line 1, col 1"},
		{"after a string", "{{ 'a}}' }}\n{{ x", "unclosed expression tag at line 2, col 1"},
		{"after an escaped newline", "{{ 'a\\\nb' }}\n{{ x", "unclosed expression tag at line 3, col 1"},
		{"trim flags", "{{- 1 -}}\n {{- x", "unclosed expression tag at line 2, col 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := scan(tc.src)
			require.Error(t, err)
			assert.Equal(t, tc.want, err.Error())
		})
	}
}

// Tags, their trim flags and the text between them are segments of their own.
func TestScanSegments(t *testing.T) {
	segs, err := scan("a{{- x -}}b{% y %}{# '}} #}")
	require.NoError(t, err)
	want := []segment{
		{kind: segText, text: "a", line: 1, col: 1},
		{kind: segExpr, text: " x ", trimLeft: true, trimRight: true, line: 1, col: 2},
		{kind: segText, text: "b", line: 1, col: 11},
		{kind: segStmt, text: " y ", line: 1, col: 12},
		{kind: segComment, text: " '}} ", line: 1, col: 19},
	}
	assert.Equal(t, want, segs)
}
