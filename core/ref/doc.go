// Package ref is the CPU reference backend: it defines what every op of abi/OPS.md computes.
//
// It is written to be obviously correct, not fast: each node dequantizes its inputs to float64,
// computes in float64 (gonum where natural) and rounds once to the output dtype. Every other
// backend is checked against it by the conformance suite.
//
// New returns the backend ("ref", one CPU device "ref:0"); Run evaluates a graph directly, which
// is what tests, the conformance suite and the demo use:
//
//	outs, err := ref.Run(ctx, g, [][]byte{core.EncodeF32(x)})
package ref
