package main

import "testing"

// TestTimeoutFlag: --timeout (the isolated execute deadline) is accepted by run and conform
// and a negative one is a usage error before any work.
func TestTimeoutFlag(t *testing.T) {
	runCLICases(t, nil, []cliCase{
		{"run negative", []string{"run", "--model", "x", "--timeout", "-1s"}, 2, "--timeout -1s"},
		{"conform negative", []string{"conform", "--plugin", "ref", "--timeout", "-5ms"}, 2, "--timeout -5ms"},
		{"run not a duration", []string{"run", "--model", "x", "--timeout", "soon"}, 2, "--timeout"},
		{"conform accepts it", []string{"conform", "--plugin", "ref", "--filter", `^RELU\(dtype=f32`,
			"--report", "", "--timeout", "5s"}, 0, ""},
	})
}
