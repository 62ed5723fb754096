// Package core holds what every part of xpu shares: data types, the graph builder with shape
// inference, the Backend/Device/Context interfaces that every backend presents (the purego
// adapter, the isolated client and the reference alike). Where a graph runs (placement,
// partitions, sessions, execution units) is package sched's business, not core's.
//
// A graph is built once, checked at build time (an error names the node), and then run by
// sched on one or more devices:
//
//	g := core.NewGraph()
//	x := g.Input("x", core.F32, 4, 64)
//	w := g.Const("w", core.F32, []int64{32, 64}, weights)
//	g.Output(g.MatMul(x, w))
//	if err := g.Err(); err != nil { ... }
//
// Op semantics are defined in abi/OPS.md and implemented first in core/ref.
package core
