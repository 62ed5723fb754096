package solve

import (
	"slices"
	"time"

	"github.com/xpuhub/xpu/sched/dag"
)

// runtimeFirstCost is what sched's runtime assumes for a partition it has never run (its
// dispatch simulation's default, sched.Program.simulate).
const runtimeFirstCost = time.Millisecond

// runtimeOrder is each unit's task order as sched's runtime fixes it for a request whose
// partitions have not run before (a first prefill, `xpu run`'s): its dispatch simulation under
// pol with every task at runtimeFirstCost. The runtime then runs each unit's tasks in that
// order whatever they really cost.
func runtimeOrder(d *dag.DAG, pol dag.Policy) ([][]int, error) {
	u, err := dag.New(d.Units)
	if err != nil {
		return nil, err
	}
	for _, t := range d.Tasks {
		t.Cost = runtimeFirstCost
		t.ID = 0
		if _, err := u.Add(t); err != nil {
			return nil, err
		}
	}
	res, err := dag.Simulate(u, pol)
	if err != nil {
		return nil, err
	}
	return res.Order, nil
}

// fixedOrder is a policy that runs each unit's tasks in a given order, waiting when the next
// one is not ready (the runtime's per-unit queues).
type fixedOrder struct {
	order [][]int
	pos   []int
}

func newFixedOrder(order [][]int) *fixedOrder {
	return &fixedOrder{order: order, pos: make([]int, len(order))}
}

func (*fixedOrder) Name() string { return "runtime order" }

func (f *fixedOrder) Pick(_ *dag.Dispatcher, u int, ready []int) int {
	if u >= len(f.order) || f.pos[u] >= len(f.order[u]) {
		return -1
	}
	i := slices.Index(ready, f.order[u][f.pos[u]])
	if i >= 0 {
		f.pos[u]++
	}
	return i
}
