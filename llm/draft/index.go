package draft

import "maps"

// Index is a suffix automaton over token documents (Mohri et al.; SAM-decoding's retriever):
// every substring of the text is a path from the root, so the longest suffix of a query that
// occurs in the text is found in time linear in the query, and tokens are inserted one at a
// time (amortized constant time each). Each state remembers where its strings first end, which
// is where a continuation is read from. Documents are separated by tokens that never occur in a
// query, so no match crosses one.
type Index struct {
	st   []samState
	last int32
	text []int32
	sep  int32 // the next separator (negative, unique)
	// kids is the suffix-link tree, kept as links change: a state's occurrences are the
	// first positions of the states below it.
	kids [][]int32
}

type samState struct {
	len, link, first int32
	next             map[int32]int32
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{st: []samState{{link: -1, first: -1}}, sep: -1, kids: [][]int32{nil}}
}

// Len is the number of tokens indexed, separators included.
func (x *Index) Len() int { return len(x.text) }

// AddDoc starts a new document (so that no match crosses from the previous one) and appends
// tokens to it.
func (x *Index) AddDoc(tokens []int32) {
	if len(x.text) > 0 {
		x.add(x.sep)
		x.sep--
	}
	for _, t := range tokens {
		x.Append(t)
	}
}

// Append adds a token to the current document. Negative tokens are ignored.
func (x *Index) Append(t int32) {
	if t >= 0 {
		x.add(t)
	}
}

func (x *Index) add(t int32) {
	pos := int32(len(x.text))
	x.text = append(x.text, t)
	cur := x.newState(samState{len: x.st[x.last].len + 1, first: pos, link: -1})
	p := x.last
	for p != -1 && !x.has(p, t) {
		x.set(p, t, cur)
		p = x.st[p].link
	}
	switch {
	case p == -1:
		x.setLink(cur, 0)
	case x.st[p].len+1 == x.st[x.st[p].next[t]].len:
		x.setLink(cur, x.st[p].next[t])
	default:
		q := x.st[p].next[t]
		clone := x.newState(samState{len: x.st[p].len + 1, link: -1, first: x.st[q].first,
			next: maps.Clone(x.st[q].next)})
		x.setLink(clone, x.st[q].link)
		for p != -1 && x.st[p].next[t] == q {
			x.st[p].next[t] = clone
			p = x.st[p].link
		}
		x.setLink(q, clone)
		x.setLink(cur, clone)
	}
	x.last = cur
}

func (x *Index) newState(s samState) int32 {
	x.st = append(x.st, s)
	x.kids = append(x.kids, nil)
	return int32(len(x.st) - 1)
}

// setLink points v's suffix link at to, moving v in the link tree.
func (x *Index) setLink(v, to int32) {
	if old := x.st[v].link; old >= 0 {
		ks := x.kids[old]
		for i, k := range ks {
			if k == v {
				ks[i] = ks[len(ks)-1]
				x.kids[old] = ks[:len(ks)-1]
				break
			}
		}
	}
	x.st[v].link = to
	x.kids[to] = append(x.kids[to], v)
}

func (x *Index) has(s, t int32) bool {
	_, ok := x.st[s].next[t]
	return ok
}

func (x *Index) set(s, t, to int32) {
	if x.st[s].next == nil {
		x.st[s].next = map[int32]int32{}
	}
	x.st[s].next[t] = to
}

// Lookup finds the longest suffix of query that occurs in the text followed by at least one
// more token of its document, and returns its length and up to n tokens that follow one such
// occurrence, the first when it has a continuation (stopping at the document's end). A length
// of 0 means no suffix matched.
func (x *Index) Lookup(query []int32, n int) (int, []int32) {
	s, l := int32(0), 0
	for _, t := range query {
		for s != 0 && !x.has(s, t) {
			s = x.st[s].link
			l = int(x.st[s].len)
		}
		if to, ok := x.st[s].next[t]; ok {
			s, l = to, l+1
		} else {
			s, l = 0, 0
		}
	}
	for s != 0 {
		if p := x.occurrence(s); p >= 0 {
			var out []int32
			for i := p + 1; i < len(x.text) && len(out) < n && x.text[i] >= 0; i++ {
				out = append(out, x.text[i])
			}
			return l, out
		}
		s = x.st[s].link
		l = int(x.st[s].len)
	}
	return 0, nil
}

// maxVisit bounds the search for an occurrence with a continuation.
const maxVisit = 256

// occurrence is an end position of state s's strings that a token of the same document
// follows, or -1: the first occurrence when it has one (an occurrence at the end of the text
// or of a document has none), else one found in s's suffix-link subtree.
func (x *Index) occurrence(s int32) int {
	ok := func(v int32) bool {
		e := int(x.st[v].first) + 1
		return e < len(x.text) && x.text[e] >= 0
	}
	if ok(s) {
		return int(x.st[s].first)
	}
	stack := append([]int32(nil), x.kids[s]...)
	for visited := 0; len(stack) > 0 && visited < maxVisit; visited++ {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if ok(v) {
			return int(x.st[v].first)
		}
		stack = append(stack, x.kids[v]...)
	}
	return -1
}
