package llmbench_test

import (
	"fmt"

	"github.com/xpuhub/xpu/llm/llmbench"
)

// The tests of `xpu bench -m MODEL -p 512 -n 128 -d 0,1024`, in llama-bench's order.
func ExampleTests() {
	for _, t := range llmbench.Tests([]int{512}, []int{128}, nil, []int{0, 1024}) {
		fmt.Printf("%s: %d timed tokens, %d tokens of context\n", t.Name(), t.Tokens(), t.ContextNeeded())
	}
	// Output:
	// pp512: 512 timed tokens, 512 tokens of context
	// tg128: 128 timed tokens, 128 tokens of context
	// pp512 @ d1024: 512 timed tokens, 1536 tokens of context
	// tg128 @ d1024: 128 timed tokens, 1152 tokens of context
}
