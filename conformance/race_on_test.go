//go:build race

package conformance

// raceEnabled: the race detector slows the float64 reference about fifty-fold, so the
// whole-matrix test leaves out its largest cases (the mutant and CLI tests still run them).
const raceEnabled = true
