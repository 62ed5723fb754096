package main

import (
	"flag"
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/plugins/coreml"
)

func TestCoremlUnitsFlag(t *testing.T) {
	for _, c := range []struct {
		arg  string
		want string // env value after apply; "" = unset
		ok   bool
	}{
		{"", "", true},
		{"ane", "ane", true},
		{"cpu", "cpu", true},
		{"tpu", "", false},
	} {
		t.Run(c.arg, func(t *testing.T) {
			t.Setenv(coreml.EnvUnits, "")
			os.Unsetenv(coreml.EnvUnits)
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			apply := coremlUnitsFlag(fs)
			var args []string
			if c.arg != "" {
				args = []string{"--coreml-units", c.arg}
			}
			require.NoError(t, fs.Parse(args))
			err := apply()
			if !c.ok {
				assert.ErrorContains(t, err, "want one of")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, os.Getenv(coreml.EnvUnits))
		})
	}
}
