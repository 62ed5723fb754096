package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestTimeoutFlag: --timeout (the isolated execute deadline) is accepted by run and conform
// and a negative one is a usage error before any work.
func TestTimeoutFlag(t *testing.T) {
	tests := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"run negative", []string{"run", "--model", "x", "--timeout", "-1s"}, 2, "--timeout -1s"},
		{"conform negative", []string{"conform", "--plugin", "ref", "--timeout", "-5ms"}, 2, "--timeout -5ms"},
		{"run not a duration", []string{"run", "--model", "x", "--timeout", "soon"}, 2, "--timeout"},
		{"conform accepts it", []string{"conform", "--plugin", "ref", "--filter", `^RELU\(dtype=f32`,
			"--report", "", "--timeout", "5s"}, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := runCLI(t, tt.args...)
			assert.Equal(t, tt.code, code, errOut)
			assert.Contains(t, errOut, tt.msg)
		})
	}
}
