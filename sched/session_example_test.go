package sched_test

import (
	"context"
	"fmt"
	"log"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/sched"
)

// A graph is placed on the devices at hand once, then run as often as needed.
func ExampleNewSession() {
	ctx := context.Background()
	g := core.NewGraph()
	x := g.Input("x", core.F32, 2, 3)
	w := g.Const("w", core.F32, core.Shape{2, 3}, core.EncodeF32([]float32{1, 0, 0, 0, 1, 1}))
	g.Output(g.Named("relu").ReLU(g.Named("proj").MatMul(x, w)))
	if err := g.Err(); err != nil {
		log.Fatal(err)
	}

	backend := ref.New()
	defer backend.Close()
	s, err := sched.NewSession(ctx, g, backend.Devices(), sched.WithPolicy(sched.PreferNPU))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	out, err := s.Run(ctx, [][]byte{core.EncodeF32([]float32{1, 2, 3, -4, 5, -6})})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(core.DecodeF32(out[0]))
	fmt.Print(s.Report())
	// Output:
	// [1 5 0 0]
	// policy prefer-npu; units ref:0; 1 partition(s); 0 copies per run (0 bytes)
	// NODE  OP      UNIT   PART  PRECISION  COPIES  FALLBACK
	// proj  MATMUL  ref:0  0     f32        0
	// relu  RELU    ref:0  0     f32        0
}

// Units are devices with context options: here two units of the one reference device, with
// the MATMUL on the second (each unit has a context of its own).
func ExampleUnitDevices() {
	ctx := context.Background()
	g := core.NewGraph()
	x := g.Input("x", core.F32, 2, 3)
	w := g.Const("w", core.F32, core.Shape{2, 3}, core.EncodeF32([]float32{1, 0, 0, 0, 1, 1}))
	g.Output(g.Named("relu").ReLU(g.Named("proj").MatMul(x, w)))

	backend := ref.New()
	defer backend.Close()
	specs, err := sched.ParseUnitList("ref{threads=1},ref{threads=2}")
	if err != nil {
		log.Fatal(err)
	}
	units, err := sched.UnitDevices(specs, backend.Devices())
	if err != nil {
		log.Fatal(err)
	}
	matmulOnSecond := sched.PolicyFunc("matmul-on-second", func(n *core.Node, ds []core.Device) []core.Device {
		if n.Op == core.OpMatMul {
			return ds[1:]
		}
		return ds[:1]
	})
	s, err := sched.NewSession(ctx, g, units, sched.WithPolicy(matmulOnSecond))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	out, err := s.Run(ctx, [][]byte{core.EncodeF32([]float32{1, 2, 3, -4, 5, -6})})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(core.DecodeF32(out[0]))
	fmt.Print(s.Report())
	// Output:
	// [1 5 0 0]
	// policy matmul-on-second; units ref:0{threads=1} ref:0{threads=2}; 2 partition(s); 1 copies per run (16 bytes)
	// NODE  OP      UNIT              PART  PRECISION  COPIES  FALLBACK
	// proj  MATMUL  ref:0{threads=2}  0     f32        0
	// relu  RELU    ref:0{threads=1}  1     f32        1
}
