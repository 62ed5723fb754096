package cputopo_test

import (
	"fmt"

	"github.com/xpuhub/xpu/sched/cputopo"
)

// The Mate 40 Pro's tree: prefill on the four A77s, decode on two of the 2.54 GHz ones (the
// paper's tuned selection), as neon options.
func ExampleNeonPhaseOptions() {
	top, err := cputopo.Read(cputopo.WithRoot("testdata/kirin9000"))
	if err != nil {
		panic(err)
	}
	fmt.Println(top, "-", top.SpaceSize(), "selections")
	decode := cputopo.Selection{0, 2, 0}
	po, err := cputopo.NeonPhaseOptions(top, cputopo.Selection{1, 3, 0}, decode)
	if err != nil {
		panic(err)
	}
	fmt.Println("context:", po.Context)
	fmt.Println("prefill:", po.Prefill)
	fmt.Println("decode: ", po.Decode, decode.Describe(top))
	// Output:
	// 1×Cortex-A77@3.13GHz + 3×Cortex-A77@2.54GHz + 4×Cortex-A55@2.05GHz - 39 selections
	// context: map[threads:4]
	// prefill: map[cpus:4,5,6,7 threads:4]
	// decode:  map[cpus:4,5 threads:2] 2×Cortex-A77@2.54GHz
}
