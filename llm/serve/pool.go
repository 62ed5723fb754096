package serve

import (
	"context"
	"slices"
	"sync"
)

// pool holds the free slots and the requests waiting for one, first come first served.
//
// A request that finds several slots free takes the one whose cache holds the longest prefix
// of its prompt (llama-server's slot selection by prompt similarity), so that conversations
// resent turn by turn each come back to the slot that answered their last turn. A slot counts
// as a match only when the request keeps at least half of what the slot holds: otherwise it
// would throw away another conversation's cache for a few shared tokens (a system prompt, a
// template's header), and the least recently used slot is taken instead.
type pool struct {
	mu      sync.Mutex
	free    []*slot
	waiters []chan *slot // FIFO: each gets the next slot put back
	clock   uint64       // put count, the slots' last-use stamps
}

// take removes and returns the free slot that suits prompt best, nil when none is free.
func (p *pool) take(prompt []int32) *slot {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.takeLocked(prompt)
}

func (p *pool) takeLocked(prompt []int32) *slot {
	if len(p.free) == 0 {
		return nil
	}
	best, bestLen := -1, -1
	lru := 0
	for i, sl := range p.free {
		if sl.used < p.free[lru].used {
			lru = i
		}
		if sl.broken {
			continue
		}
		n := sl.r.CachedPrefix(prompt)
		if 2*n >= sl.r.Len() && (n > bestLen || n == bestLen && sl.used < p.free[best].used) {
			best, bestLen = i, n
		}
	}
	if best < 0 {
		best = lru
	}
	sl := p.free[best]
	p.free = slices.Delete(p.free, best, best+1)
	return sl
}

// get takes a free slot or waits for one in the queue; full says the queue (at most maxQueue
// waiting) had no room, and a nil slot without full means ctx ended first.
func (p *pool) get(ctx context.Context, prompt []int32, maxQueue int) (sl *slot, full bool) {
	p.mu.Lock()
	if sl := p.takeLocked(prompt); sl != nil {
		p.mu.Unlock()
		return sl, false
	}
	if len(p.waiters) >= maxQueue {
		p.mu.Unlock()
		return nil, true
	}
	ch := make(chan *slot, 1)
	p.waiters = append(p.waiters, ch)
	p.mu.Unlock()
	select {
	case sl := <-ch:
		return sl, false
	case <-ctx.Done():
	}
	p.mu.Lock()
	if i := slices.Index(p.waiters, ch); i >= 0 {
		p.waiters = slices.Delete(p.waiters, i, i+1)
		p.mu.Unlock()
		return nil, false
	}
	p.mu.Unlock()
	// a slot was handed over as ctx ended: pass it on
	p.put(<-ch)
	return nil, false
}

// put gives sl back: to the longest waiting request, or to the free slots.
func (p *pool) put(sl *slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clock++
	sl.used = p.clock
	if len(p.waiters) > 0 {
		ch := p.waiters[0]
		p.waiters = slices.Delete(p.waiters, 0, 1)
		ch <- sl
		return
	}
	p.free = append(p.free, sl)
}

// idle is how many slots are free; waiting is how many requests wait for one.
func (p *pool) idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}

func (p *pool) waiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.waiters)
}
