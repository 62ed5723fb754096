package prompt

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// A chat template is untrusted input (it comes from the model file): one that recurses, builds
// huge text or loops for long is refused when it is loaded, with ErrLimit, instead of
// overflowing the stack (a fatal error), exhausting memory or hanging.
func TestChatTemplateLimitsAtLoad(t *testing.T) {
	tok := storiesTokenizer(t)
	tests := []struct{ name, src string }{
		{"recursive macro", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"},
		{"mutual recursion", "{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}"},
		{"huge range", "{% for i in range(100000000) %}x{% endfor %}"},
		{"nested loops", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"},
		{"doubling string", "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"},
		{"string repeat", "{{ 'x' * 10000000000 }}"},
		{"huge output", "{% for i in range(1000000) %}{{ 'y' * 1000 }}{% endfor %}"},
		{"list doubling", "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}"},
		{"deep expression", "{{ " + strings.Repeat("(", 100000) + "1" + strings.Repeat(")", 100000) + " }}"},
		{"deep blocks", strings.Repeat("{% if true %}", 100000) + "x" + strings.Repeat("{% endif %}", 100000)},
		{"wide indent", "{{ 'a\nb' | indent(2000000000) }}"},
		{"source too large", "{# " + strings.Repeat("x", 2<<20) + " #}"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Now()
			_, err := New(tok, tc.src)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrLimit)
			assert.ErrorIs(t, err, core.ErrInvalidArgument)
			assert.Less(t, time.Since(t0), 5*time.Second, "refused promptly")
		})
	}
}

// Templates within the limits still work, including the corner cases the limits touch.
func TestChatTemplateWithinLimits(t *testing.T) {
	tok := storiesTokenizer(t)
	tests := []struct{ name, src, want string }{
		{"negative repeat", "{{ 'x' * -1 }}|", "|"},
		{"range near the int64 limit", "{% for i in range(9223372036854775805, 9223372036854775807) %}{{ i }},{% endfor %}",
			"9223372036854775805,9223372036854775806,"},
		{"range with a step", "{% for i in range(10, 0, -3) %}{{ i }},{% endfor %}", "10,7,4,1,"},
		{"macro nesting", "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{{ n }}{% endmacro %}{{ f(20) }}",
			"01234567891011121314151617181920"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ct, err := New(tok, tc.src)
			require.NoError(t, err)
			got, err := ct.Render(nil, true)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// A template that is slow only on some inputs (quadratic in a message's length) passes the load
// check; rendering such an input stops at the step limit, or at the caller's deadline.
func TestChatTemplateLimitsAtRender(t *testing.T) {
	tok := storiesTokenizer(t)
	ct, err := New(tok, "{% for m in messages %}{% for a in m.content %}{% for b in m.content %}"+
		"{% endfor %}{% endfor %}{{ m.content }}{% endfor %}")
	require.NoError(t, err)
	long := []Message{{Role: "user", Content: strings.Repeat("x", 20000)}}

	old := templateLimits
	templateLimits.MaxSteps = 100_000 // the default's ten million take seconds
	_, err = ct.Render(long, true)
	templateLimits = old
	require.ErrorIs(t, err, ErrLimit)
	assert.Contains(t, err.Error(), "100000 steps")

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, _, err = ct.PromptContext(ctx, tok, long)
	require.ErrorIs(t, err, ErrLimit)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "the caller's deadline stopped it: %v", err)
	assert.Less(t, time.Since(t0), time.Second)
}
