package conformance

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/loader"
)

// The validation layer raises no false alarm over a whole conformance run of a correct plugin,
// in process and isolated, and a rule the plugin breaks fails its cases with the rule named.
func TestSuiteUnderValidation(t *testing.T) {
	plugins := buildMutants(t, "", "MUT_HALF_PRECISION")
	modes := []struct {
		name string
		opts []loader.Option
	}{
		{"in-process", []loader.Option{loader.WithValidation()}},
		{"isolated", []loader.Option{loader.WithValidation(), loader.Isolated()}},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			if testing.Short() && m.name == "isolated" {
				t.Skip("starts a plugin-host child process: not in -short")
			}
			rep := runPluginWith(t, plugins[""], m.opts)
			assert.Zero(t, rep.Failed, "false alarms: %v", rep.Failures())
			assert.Positive(t, rep.Passed)

			bad := runPluginWith(t, plugins["MUT_HALF_PRECISION"], m.opts,
				WithFilter(regexp.MustCompile(`^ADD\(dtype=f32,a=\[3,33\],b=\[3,33\]\)$`)))
			require.Len(t, bad.Cases, 1)
			c := bad.Cases[0]
			assert.Equal(t, StatusFail, c.Status)
			assert.Contains(t, c.Errors[0], "rule precision")
		})
	}
}
