package sched_test

import (
	"fmt"

	"github.com/xpuhub/xpu/sched"
)

// After a verify step, the draft tree's rows sit at cache rows base+0..base+5; the accepted
// path is tree tokens 0, 2 and 5. Compaction leaves them at rows base, base+1, base+2.
func ExampleArena_CompactRows() {
	a := sched.NewArena()
	defer a.Close()
	const rowBytes, base = 32, 3
	cache, err := a.Alloc(16 * rowBytes)
	if err != nil {
		panic(err)
	}
	rows := a.Bytes(cache)
	for r := range 16 {
		rows[r*rowBytes] = byte(r) // each row starts with its own index
	}
	moved, err := a.CompactRows(cache, rowBytes, base, []int{0, 2, 5})
	if err != nil {
		panic(err)
	}
	for r := base; r < base+3; r++ {
		fmt.Print(rows[r*rowBytes], " ")
	}
	fmt.Println(moved)
	// Output: 3 5 8 true
}
