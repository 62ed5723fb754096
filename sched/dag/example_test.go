package dag_test

import (
	"fmt"
	"time"

	"github.com/xpuhub/xpu/sched/dag"
)

// Two chunks through a CPU → NPU → CPU → NPU chain of subgraphs: in order, the CPU waits for
// chunk 0's attention before chunk 1's norm and the NPU idles; out of order, the CPU runs chunk
// 1's norm first (it unlocks NPU work), so the NPU has chunk 1's projection to do meanwhile.
func ExampleSimulate() {
	const cpu, npu = 0, 1
	ms := time.Millisecond
	d, err := dag.Chunked(2, 2, func(chunk int) []dag.Step {
		return []dag.Step{
			{Name: "norm", Parts: []dag.Part{{Unit: cpu, Cost: 1 * ms}}},
			{Name: "qkv", Parts: []dag.Part{{Unit: npu, Cost: 4 * ms}}},
			{Name: "attn", CrossChunk: true, Parts: []dag.Part{{Unit: cpu, Cost: 3 * ms}}},
			{Name: "ffn", Parts: []dag.Part{{Unit: npu, Cost: 6 * ms}}},
		}
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, p := range []dag.Policy{dag.InOrder, dag.OutOfOrder} {
		r, err := dag.Simulate(d, p)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: %v, NPU bubble %.0f%%\n", p.Name(), r.Makespan, 100*r.Bubble)
	}
	// Output:
	// inorder: 27ms, NPU bubble 26%
	// ooo: 21ms, NPU bubble 5%
}
