// Package sched runs graphs over execution units: devices plus the context options they run
// with, so that one physical processor can be several units. It is the only road from a model
// to a backend (see ../shared/design/SCHEDULER.md for the intended shape).
//
// A Runtime opens its units once and owns an arena every unit imports; a Program is a
// sequence of stage graphs whose nodes are placed on units, compiled once and run per chunk.
// The LLM runtime, the profiler and the solver all run through it. In short (as
// ggml-backend.h's example, and runnable as ExampleRuntime):
//
//	be, _ := core.OpenBackend(ctx, nil, "neon")  // built in, or a plugin the loader found
//	rt, _ := sched.NewRuntime(ctx, be.Devices(), []sched.UnitSpec{{Backend: "neon"}})
//	defer rt.Close()
//	x, _ := rt.Arena().Alloc(4 * 4)              // inputs and outputs live in the arena
//	y, _ := rt.Arena().Alloc(4 * 4)
//	g := core.NewGraph()
//	in := g.Input("x", core.F32, 4)
//	g.Output(g.ReLU(in))
//	p, _ := rt.Compile(ctx, sched.ProgramSpec{Name: "relu", Phase: sched.PhasePrefill,
//		Stages: []sched.StageSpec{{Graph: g, Units: []int{0}, // node ID -> unit index
//			IO: []sched.Binding{{Span: x}, {Span: y}}}}})
//	defer p.Close()
//	copy(rt.Arena().Bytes(x), core.EncodeF32([]float32{-1, 2, -3, 4}))
//	_ = p.Run(ctx, []sched.Chunk{{}})                // one chunk: the whole graph once
//	fmt.Println(core.DecodeF32(rt.Arena().Bytes(y)[:16])) // [0 2 0 4]
//
// NewSession is the one-graph front end over a Runtime: it places a graph's nodes on the
// devices by a Policy (falling back to the CPU for refused nodes) and runs the graph as a
// one-stage Program whose inputs and outputs are arena spans; an Executor shares one runtime,
// its units and its prepared executables among sessions. Choose ranks devices by a Policy and tries them in turn (llm.Load's
// device choice).
package sched
