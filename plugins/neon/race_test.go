//go:build race

package neon_test

// raceEnabled: under -race the Go side of the conformance suite runs ~20x slower, so the suite
// runs on one build only (the plugin's C code is the same for both; the smoke test covers both).
const raceEnabled = true
