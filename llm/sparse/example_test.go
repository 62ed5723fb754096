package sparse_test

import (
	"fmt"

	"github.com/xpuhub/xpu/llm/sparse"
)

func ExampleParseSize() {
	for _, s := range []string{"2GiB", "512MiB", "1.5GB", "4096"} {
		n, err := sparse.ParseSize(s)
		fmt.Println(n, err)
	}
	_, err := sparse.ParseSize("lots")
	fmt.Println(err != nil)
	// Output:
	// 2147483648 <nil>
	// 536870912 <nil>
	// 1500000000 <nil>
	// 4096 <nil>
	// true
}

func ExampleBundleWidth() {
	// A gated neuron's bundle row: gate row, up row and down column of a 4096-wide model.
	fmt.Println(sparse.BundleWidth(4096, true), sparse.BundleWidth(4096, false))
	// Output: 12288 8192
}
