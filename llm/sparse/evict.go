package sparse

// Eviction is the cold cache's replacement policy: which cached cold neuron gives its slot to a
// neuron that missed.
type Eviction int

const (
	// EvictLRU evicts the neuron used least recently (the default): decode's working set drifts
	// with the text, and recency follows the drift.
	EvictLRU Eviction = iota
	// EvictLeastFrequent evicts the neuron used by the fewest selections since it was loaded
	// (ties: the least recently used); it keeps neurons that fire often but not every token.
	EvictLeastFrequent
)

// String names the policy.
func (e Eviction) String() string {
	switch e {
	case EvictLRU:
		return "lru"
	case EvictLeastFrequent:
		return "lfu"
	}
	return "eviction(?)"
}

// evictor orders the cold slots that hold a neuron and may be evicted. A slot holding a neuron
// of the selection in progress is taken out (remove) and put back (push) once the selection is
// done, so victim never offers it. Every method is O(1) or O(log slots) and allocation-free.
type evictor interface {
	// push adds slot s as the most recently used; used says it held the same neuron before (a
	// hit), otherwise it was just loaded.
	push(s int32, used bool)
	// remove takes s out.
	remove(s int32)
	// victim takes out and returns the slot to evict, -1 when none is left.
	victim() int32
}

func newEvictor(p Eviction, slots int) evictor {
	if p == EvictLeastFrequent {
		return newLFU(slots)
	}
	return newLRU(slots)
}

// lru is an intrusive doubly linked list over the slots, head = most recent. Index slots is the
// sentinel.
type lru struct {
	prev, next []int32
	in         []bool
}

func newLRU(slots int) *lru {
	l := &lru{prev: make([]int32, slots+1), next: make([]int32, slots+1), in: make([]bool, slots)}
	l.prev[slots], l.next[slots] = int32(slots), int32(slots)
	return l
}

func (l *lru) push(s int32, _ bool) {
	if l.in[s] {
		l.remove(s)
	}
	head := int32(len(l.in))
	n := l.next[head]
	l.next[head], l.prev[s], l.next[s], l.prev[n] = s, head, n, s
	l.in[s] = true
}

func (l *lru) remove(s int32) {
	if !l.in[s] {
		return
	}
	p, n := l.prev[s], l.next[s]
	l.next[p], l.prev[n] = n, p
	l.in[s] = false
}

func (l *lru) victim() int32 {
	head := int32(len(l.in))
	t := l.prev[head]
	if t == head {
		return -1
	}
	l.remove(t)
	return t
}

// lfu is a binary min-heap of slots keyed by (uses, last use).
type lfu struct {
	heap  []int32 // slots
	pos   []int32 // slot → index in heap, -1 when out
	uses  []uint64
	stamp []uint64
	tick  uint64
}

func newLFU(slots int) *lfu {
	f := &lfu{heap: make([]int32, 0, slots), pos: make([]int32, slots), uses: make([]uint64, slots), stamp: make([]uint64, slots)}
	for i := range f.pos {
		f.pos[i] = -1
	}
	return f
}

func (f *lfu) less(a, b int32) bool {
	if f.uses[a] != f.uses[b] {
		return f.uses[a] < f.uses[b]
	}
	return f.stamp[a] < f.stamp[b]
}

func (f *lfu) swap(i, j int) {
	f.heap[i], f.heap[j] = f.heap[j], f.heap[i]
	f.pos[f.heap[i]], f.pos[f.heap[j]] = int32(i), int32(j)
}

func (f *lfu) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !f.less(f.heap[i], f.heap[p]) {
			return
		}
		f.swap(i, p)
		i = p
	}
}

func (f *lfu) down(i int) {
	n := len(f.heap)
	for {
		m, l, r := i, 2*i+1, 2*i+2
		if l < n && f.less(f.heap[l], f.heap[m]) {
			m = l
		}
		if r < n && f.less(f.heap[r], f.heap[m]) {
			m = r
		}
		if m == i {
			return
		}
		f.swap(i, m)
		i = m
	}
}

func (f *lfu) push(s int32, used bool) {
	f.remove(s)
	f.tick++
	if used {
		f.uses[s]++
	} else {
		f.uses[s] = 1
	}
	f.stamp[s] = f.tick
	f.heap = append(f.heap, s)
	f.pos[s] = int32(len(f.heap) - 1)
	f.up(len(f.heap) - 1)
}

func (f *lfu) remove(s int32) {
	i := int(f.pos[s])
	if i < 0 {
		return
	}
	last := len(f.heap) - 1
	if i != last {
		f.swap(i, last)
	}
	f.heap = f.heap[:last]
	f.pos[s] = -1
	if i != last {
		f.down(i)
		f.up(i)
	}
}

func (f *lfu) victim() int32 {
	if len(f.heap) == 0 {
		return -1
	}
	s := f.heap[0]
	f.remove(s)
	return s
}
