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

func ExampleRuntimeStats_String() {
	// What `xpu run --stats` prints for a sparse run (here a made-up one): the budget split,
	// where the selected neurons came from, the cold reads and the host time.
	st := sparse.RuntimeStats{
		Budget: 6 << 30, FixedBytes: 4 << 30, HotBytes: 1536 << 20, ColdBytes: 512 << 20, StagingBytes: 1<<20 + 8<<10,
		HotRowsResident: 233016, ColdSlots: 77672, Eviction: sparse.EvictLRU, DirectIO: true,
		Tokens: 100, Selected: 1_000_000, HotRows: 700_000, ColdHits: 250_000, ColdMisses: 50_000,
		BytesRead: 400 << 20, Reads: 30_000, LoadBytes: 1536 << 20,
	}
	fmt.Println(st)
	// Output:
	// sparse budget 6144.0 MiB: fixed 4096.0 MiB, hot 1536.0 MiB (233016 rows), cold 512.0 MiB (77672 slots, lru), I/O buffer 1.0 MiB
	//   100 tokens, 1000000 neuron rows selected: 70.0% hot, 25.0% cold hits, 5.0% misses (cold hit rate 83.3%)
	//   read 400.0 MiB in 30000 direct reads (4096.0 KiB per token), loaded 1536.0 MiB
	//   host: predict 0s, I/O wait 0s (I/O busy 0s), compute 0s
}
