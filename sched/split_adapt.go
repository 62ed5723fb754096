package sched

import (
	"math"
	"sync/atomic"
	"time"
)

// adaptGain is how far one request chunk's measurement moves a cutBalancer's estimate: a
// quarter, so the estimate follows a drift of the cores' speeds within a few tokens (the gap
// here changes over seconds, ~30 tokens of a 1B decode) while one token's noise (an
// interrupt, a preempted part) moves the cut by at most one point.
const adaptGain = 0.25

// cutBalancer picks the cut point of a program's adaptive splits (NodeSplit.Adapt) for each
// request: the share of the rows that makes both units' parts take the same time, estimated
// from the time each side's parts ran in the requests before. One balancer serves every
// adaptive split of the program: a unit's speed is its core's, the same for every MATMUL.
type cutBalancer struct {
	shares []float64       // the first unit's share at each cut point (adaptShares), ascending
	busy   [2]atomic.Int64 // ns each side's adaptive parts ran since the last pick
	est    float64         // the balanced share, estimated (under the runtime's runMu)
	cur    int             // the cut point of the last pick
}

func newCutBalancer(share float64) *cutBalancer {
	b := &cutBalancer{shares: adaptShares(share), est: share}
	b.cur = b.nearest()
	return b
}

// observe adds the time one adaptive part of side ran.
func (b *cutBalancer) observe(side int, d time.Duration) { b.busy[side].Add(int64(d)) }

// pick folds the parts' times since the last pick into the estimate and returns the cut point
// nearest to it. With share s the sides ran t0 and t1: their speeds are s/t0 and (1-s)/t1
// rows per ns, and equal times need the share s·t1 / (s·t1 + (1-s)·t0).
func (b *cutBalancer) pick() int {
	t0, t1 := float64(b.busy[0].Swap(0)), float64(b.busy[1].Swap(0))
	if t0 > 0 && t1 > 0 {
		s := b.shares[b.cur]
		b.est += adaptGain * (s*t1/(s*t1+(1-s)*t0) - b.est)
	}
	b.cur = b.nearest()
	return b.cur
}

// nearest is the cut point closest to the estimate.
func (b *cutBalancer) nearest() int {
	best := 0
	for i, s := range b.shares {
		if math.Abs(s-b.est) < math.Abs(b.shares[best]-b.est) {
			best = i
		}
	}
	return best
}
