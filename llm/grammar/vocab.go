package grammar

import (
	"slices"
)

// Vocab is a tokenizer's vocabulary as the matcher sees it: each token's bytes, in a trie, and
// which tokens end generation. Build it once per tokenizer; it is immutable and safe for
// concurrent use.
type Vocab struct {
	pieces []string
	stop   []bool
	stops  []int32
	nodes  []trieNode
	ends   []int32 // token ids, grouped by the node they end at
}

type trieNode struct {
	b                byte
	child, sibling   int32 // -1: none
	tokStart, tokEnd int32 // ends[tokStart:tokEnd] end here
}

// NewVocab indexes pieces (token id -> the bytes it decodes to; "" for tokens that write no
// text, which are never allowed) and stops (the tokens that end generation, allowed where the
// grammar can end).
func NewVocab(pieces []string, stops []int32) *Vocab {
	v := &Vocab{pieces: pieces, stop: make([]bool, len(pieces))}
	for _, id := range stops {
		if id >= 0 && int(id) < len(pieces) && !v.stop[id] {
			v.stop[id] = true
			v.stops = append(v.stops, id)
		}
	}
	ids := make([]int32, 0, len(pieces))
	for i, p := range pieces {
		if p != "" && !v.stop[i] {
			ids = append(ids, int32(i))
		}
	}
	slices.SortStableFunc(ids, func(a, b int32) int {
		switch {
		case pieces[a] < pieces[b]:
			return -1
		case pieces[a] > pieces[b]:
			return 1
		}
		return 0
	})
	// Build the trie from the sorted pieces: a node's children are added in byte order, so the
	// walk is cache-friendly and each prefix is one node.
	v.nodes = []trieNode{{child: -1, sibling: -1}}
	path := []int32{0} // path[d]: the node at depth d for the previous piece
	lastChild := map[int32]int32{}
	prev := ""
	// token lists per node, in node order: each piece ends at the node its path reaches
	type end struct{ node, id int32 }
	var ends []end
	for _, id := range ids {
		p := pieces[id]
		common := 0
		for common < len(p) && common < len(prev) && p[common] == prev[common] {
			common++
		}
		path = path[:common+1]
		for d := common; d < len(p); d++ {
			parent := path[d]
			n := int32(len(v.nodes))
			v.nodes = append(v.nodes, trieNode{b: p[d], child: -1, sibling: -1})
			if last, ok := lastChild[parent]; ok {
				v.nodes[last].sibling = n
			} else {
				v.nodes[parent].child = n
			}
			lastChild[parent] = n
			path = append(path, n)
		}
		ends = append(ends, end{path[len(p)], id})
		prev = p
	}
	slices.SortStableFunc(ends, func(a, b end) int { return int(a.node - b.node) })
	v.ends = make([]int32, len(ends))
	for i := range v.nodes {
		v.nodes[i].tokStart, v.nodes[i].tokEnd = 0, 0
	}
	for i, e := range ends {
		v.ends[i] = e.id
		nd := &v.nodes[e.node]
		if nd.tokEnd == 0 {
			nd.tokStart = int32(i)
		}
		nd.tokEnd = int32(i + 1)
	}
	return v
}

// Size is the number of tokens.
func (v *Vocab) Size() int { return len(v.pieces) }
