package main

import (
	"flag"
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBackendSettingFlags: the built-in Core ML backend's units setting is the --coreml-units
// flag; a value it does not accept is an error naming the ones it does.
func TestBackendSettingFlags(t *testing.T) {
	const env = "XPU_COREML_UNITS" // where the coreml backend keeps it for a plugin host child
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
			t.Setenv(env, "")
			os.Unsetenv(env)
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			apply := backendSettingFlags(fs)
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
			assert.Equal(t, c.want, os.Getenv(env))
		})
	}
}
