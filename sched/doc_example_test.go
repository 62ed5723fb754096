package sched_test

import (
	"context"
	"fmt"
	"log"

	"github.com/xpuhub/xpu/core"
	_ "github.com/xpuhub/xpu/core/ref" // registers the "ref" backend
	"github.com/xpuhub/xpu/sched"
)

// The runtime's road from a device to a result (the package doc's example, on the reference
// backend): open a backend, make a runtime of one unit, place a graph's inputs and outputs in
// its arena, compile, run.
func ExampleRuntime() {
	ctx := context.Background()
	be, err := core.OpenBackend(ctx, nil, "ref")
	if err != nil {
		log.Fatal(err)
	}
	defer be.Close()
	rt, err := sched.NewRuntime(ctx, be.Devices(), []sched.UnitSpec{{Backend: "ref"}})
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close()
	x, err := rt.Arena().Alloc(4 * 4)
	if err != nil {
		log.Fatal(err)
	}
	y, err := rt.Arena().Alloc(4 * 4)
	if err != nil {
		log.Fatal(err)
	}
	g := core.NewGraph()
	in := g.Input("x", core.F32, 4)
	g.Output(g.ReLU(in))
	p, err := rt.Compile(ctx, sched.ProgramSpec{Name: "relu", Phase: sched.PhasePrefill,
		Stages: []sched.StageSpec{{Graph: g, Units: []int{0},
			IO: []sched.Binding{{Span: x}, {Span: y}}}}})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	copy(rt.Arena().Bytes(x), core.EncodeF32([]float32{-1, 2, -3, 4}))
	if err := p.Run(ctx, []sched.Chunk{{}}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(core.DecodeF32(rt.Arena().Bytes(y)[:16]))
	// Output:
	// [0 2 0 4]
}
