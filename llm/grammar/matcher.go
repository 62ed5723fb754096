package grammar

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

// ErrRejected is returned when input leaves the grammar.
var ErrRejected = errors.New("grammar: input rejected")

// ErrNoToken is returned by Mask when no token of the vocabulary keeps the grammar alive (nor
// may generation end there).
var ErrNoToken = errors.New("grammar: no token of the vocabulary continues the grammar")

// maxStates bounds the automaton a matcher builds; past it the tables start over (between
// steps), so a grammar whose stacks keep growing costs time, not unbounded memory.
const maxStates = 1 << 15

// maxStacks bounds the parse stacks of one state: an ambiguous grammar ((a|a)*)* could
// otherwise multiply them without end.
const maxStacks = 4096

const (
	unknown = 0  // transition not computed yet
	dead    = -1 // transition rejects
)

// state is a set of parse stacks (each a list of element positions, top last, whose top is a
// character element; an empty stack means the grammar is complete) plus the bytes of a UTF-8
// character begun but not finished.
type state struct {
	stacks  [][]int32
	partial []byte
	accept  bool        // the input so far is a complete sentence
	final   bool        // nothing may follow (the only stack is empty)
	next    *[256]int32 // byte -> state id + 1, dead, or unknown
	mask    []uint64    // the vocabulary's allowed tokens here, once computed
	key     string      // the interning key: the same stacks in any matcher of the grammar
}

// automaton is the lazily built byte-level automaton of one grammar.
type automaton struct {
	g      *Grammar
	states []*state
	index  map[string]int32
	keyBuf []byte
	err    error // a state past maxStacks
}

func newAutomaton(g *Grammar) *automaton {
	return &automaton{g: g, index: map[string]int32{}}
}

// start interns the start state.
func (a *automaton) start() int32 {
	var out [][]int32
	for _, alt := range a.g.alts[a.g.root] {
		var st []int32
		if a.g.elems[alt].kind != kEnd {
			st = []int32{alt}
		}
		out = a.expand(st, out)
	}
	return a.intern(out, nil)
}

// expand pushes rule references until the top of st is a character element (or st is empty),
// appending each resulting stack to out. The grammar has no left recursion, so it ends.
func (a *automaton) expand(st []int32, out [][]int32) [][]int32 {
	if len(out) > maxStacks {
		return out
	}
	if len(st) == 0 {
		return append(out, st)
	}
	pos := st[len(st)-1]
	e := &a.g.elems[pos]
	if e.kind == kChar {
		return append(out, st)
	}
	base := st[:len(st)-1]
	for _, alt := range a.g.alts[e.rule] {
		ns := make([]int32, len(base), len(base)+2)
		copy(ns, base)
		if a.g.elems[pos+1].kind != kEnd {
			ns = append(ns, pos+1)
		}
		if a.g.elems[alt].kind != kEnd {
			ns = append(ns, alt)
		}
		out = a.expand(ns, out)
	}
	return out
}

// intern returns the id of the state with these stacks (deduplicated and sorted in place).
func (a *automaton) intern(stacks [][]int32, partial []byte) int32 {
	if len(stacks) > maxStacks {
		a.err = fmt.Errorf("grammar: more than %d parse stacks at once (an ambiguous grammar): %w", maxStacks, ErrRejected)
		stacks = stacks[:maxStacks]
	}
	slices.SortFunc(stacks, slices.Compare)
	stacks = slices.CompactFunc(stacks, slices.Equal)
	b := a.keyBuf[:0]
	b = append(b, byte(len(partial)))
	b = append(b, partial...)
	for _, st := range stacks {
		b = binary.AppendUvarint(b, uint64(len(st)))
		for _, p := range st {
			b = binary.AppendUvarint(b, uint64(p))
		}
	}
	a.keyBuf = b
	if id, ok := a.index[string(b)]; ok {
		return id
	}
	s := &state{stacks: stacks, partial: slices.Clone(partial), key: string(b)}
	if len(partial) == 0 {
		for _, st := range stacks {
			if len(st) == 0 {
				s.accept = true
			}
		}
		s.final = s.accept && len(stacks) == 1
	}
	id := int32(len(a.states))
	a.states = append(a.states, s)
	a.index[string(b)] = id
	return id
}

// step is the state after byte c, or dead.
func (a *automaton) step(id int32, c byte) int32 {
	s := a.states[id]
	if s.next == nil {
		s.next = new([256]int32)
	}
	if t := s.next[c]; t != unknown {
		if t == dead {
			return dead
		}
		return t - 1
	}
	t := a.compute(s, c)
	s = a.states[id] // compute may have grown the table
	if t == dead {
		s.next[c] = dead
	} else {
		s.next[c] = t + 1
	}
	return t
}

func (a *automaton) compute(s *state, c byte) int32 {
	if len(s.stacks) == 0 || s.final {
		return dead
	}
	buf := append(append(make([]byte, 0, 4), s.partial...), c)
	if !utf8.FullRune(buf) {
		if len(buf) == 1 && (c < 0xC2 || c > 0xF4) {
			return dead // a continuation byte or a byte UTF-8 never uses
		}
		if len(buf) > 1 && c&0xC0 != 0x80 {
			return dead
		}
		lo, hi := runeSpan(buf)
		if hi < lo {
			return dead
		}
		for _, st := range s.stacks {
			if len(st) > 0 && a.g.elems[st[len(st)-1]].mayMatch(lo, hi) {
				return a.intern(s.stacks, buf)
			}
		}
		return dead
	}
	r, n := utf8.DecodeRune(buf)
	if r == utf8.RuneError && n <= 1 || n != len(buf) {
		return dead
	}
	var out [][]int32
	for _, st := range s.stacks {
		if len(st) == 0 {
			continue
		}
		pos := st[len(st)-1]
		if !a.g.elems[pos].matches(r) {
			continue
		}
		ns := make([]int32, len(st)-1, len(st)+1)
		copy(ns, st)
		if a.g.elems[pos+1].kind != kEnd {
			ns = append(ns, pos+1)
		}
		out = a.expand(ns, out)
	}
	if len(out) == 0 {
		return dead
	}
	return a.intern(out, nil)
}

// runeSpan is the range of code points that UTF-8 sequences starting with prefix encode.
func runeSpan(prefix []byte) (rune, rune) {
	n := 0
	switch b := prefix[0]; {
	case b >= 0xF0:
		n = 4
	case b >= 0xE0:
		n = 3
	default:
		n = 2
	}
	lo := append(slices.Clone(prefix), make([]byte, n-len(prefix))...)
	hi := slices.Clone(lo)
	for i := len(prefix); i < n; i++ {
		lo[i], hi[i] = 0x80, 0xBF
	}
	decode := func(b []byte) rune {
		r := rune(b[0]) & (0x7F >> n)
		for _, c := range b[1:] {
			r = r<<6 | rune(c&0x3F)
		}
		return r
	}
	// the smallest code point each length may encode (shorter forms are overlong, invalid)
	least := [...]rune{2: 0x80, 3: 0x800, 4: 0x10000}[n]
	return max(decode(lo), least), min(decode(hi), utf8.MaxRune)
}

// mayMatch reports whether some code point in [lo, hi] matches the element.
func (e *elem) mayMatch(lo, hi rune) bool {
	if e.kind != kChar {
		return false
	}
	if !e.neg {
		for _, r := range e.ranges {
			if r.lo <= hi && r.hi >= lo {
				return true
			}
		}
		return false
	}
	for _, r := range e.ranges {
		if r.lo <= lo && r.hi >= hi {
			return false // one excluded range covers the whole span
		}
	}
	return true
}

// Matcher follows one generation through a grammar. It is not safe for concurrent use; make
// one per generation (the Grammar and the Vocab are shared).
type Matcher struct {
	g     *Grammar
	v     *Vocab
	a     *automaton
	cur   int32
	start int32
	walk  []walkItem
}

type walkItem struct {
	node  int32
	state int32
}

// NewMatcher starts a matcher at the grammar's start. v may be nil for a matcher that is only
// fed text (AcceptString); Mask and Accept need it.
func NewMatcher(g *Grammar, v *Vocab) *Matcher {
	m := &Matcher{g: g, v: v, a: newAutomaton(g)}
	m.start = m.a.start()
	m.cur = m.start
	return m
}

// Reset returns to the grammar's start.
func (m *Matcher) Reset() {
	m.a = newAutomaton(m.g)
	m.start = m.a.start()
	m.cur = m.start
}

// AcceptString advances over text; on ErrRejected the matcher is unchanged.
func (m *Matcher) AcceptString(text string) error {
	s := m.cur
	for i := 0; i < len(text); i++ {
		if s = m.a.step(s, text[i]); s == dead {
			return fmt.Errorf("%w at byte %d of %q", ErrRejected, i, text)
		}
	}
	if m.a.err != nil {
		return m.a.err
	}
	m.cur = s
	return nil
}

// CanEnd reports whether the text so far is a complete sentence of the grammar.
func (m *Matcher) CanEnd() bool { return m.a.states[m.cur].accept }

// Done reports whether the text is complete and nothing more may follow.
func (m *Matcher) Done() bool { return m.a.states[m.cur].final }

// Accept advances over token id (its bytes, as the vocabulary gives them). A stop token is
// accepted where the grammar can end.
func (m *Matcher) Accept(id int32) error {
	if m.v == nil || id < 0 || int(id) >= len(m.v.pieces) {
		return fmt.Errorf("grammar: token %d is outside the vocabulary: %w", id, ErrRejected)
	}
	if m.v.stop[id] {
		if !m.CanEnd() {
			return fmt.Errorf("grammar: end of generation where the grammar is not complete: %w", ErrRejected)
		}
		return nil
	}
	p := m.v.pieces[id]
	if p == "" {
		return fmt.Errorf("grammar: token %d has no text: %w", id, ErrRejected)
	}
	return m.AcceptString(p)
}

// Mask sets the logits of the tokens that would leave the grammar to -Inf; stop tokens stay
// only where the grammar can end. logits may be shorter or longer than the vocabulary: tokens
// past the vocabulary are masked, logits past len(logits) are ignored. It returns ErrNoToken
// (and leaves logits alone) when no token is allowed.
func (m *Matcher) Mask(logits []float32) error {
	if m.v == nil {
		return fmt.Errorf("grammar: a matcher without a vocabulary cannot mask: %w", ErrNoToken)
	}
	m.trim()
	mask := m.allowed()
	n := min(len(logits), len(m.v.pieces))
	any := false
	for w, bits := range mask {
		if bits != 0 && w*64 < n {
			any = true
			break
		}
	}
	if !any {
		return ErrNoToken
	}
	inf := float32(math.Inf(-1))
	for i := range n {
		if mask[i>>6]&(1<<(i&63)) == 0 {
			logits[i] = inf
		}
	}
	for i := n; i < len(logits); i++ {
		logits[i] = inf
	}
	return nil
}

// trim starts the automaton over, keeping the current state, once it holds more than
// maxStates states (between steps, so no walk holds a state id).
func (m *Matcher) trim() {
	if len(m.a.states) > maxStates {
		st := m.a.states[m.cur]
		m.a = newAutomaton(m.g)
		m.start = m.a.start()
		m.cur = m.a.intern(st.stacks, st.partial)
	}
}

// Allows reports whether token id may come next, walking only that token's bytes unless the
// state's mask is known: a cheap check for a token sampled before masking.
func (m *Matcher) Allows(id int32) bool {
	if m.v == nil || id < 0 || int(id) >= len(m.v.pieces) {
		return false
	}
	m.trim()
	st := m.a.states[m.cur]
	if st.mask != nil {
		return st.mask[id>>6]&(1<<(id&63)) != 0
	}
	if m.v.stop[id] {
		return st.accept
	}
	p := m.v.pieces[id]
	if p == "" {
		return false
	}
	s := m.cur
	for i := 0; i < len(p); i++ {
		if s = m.a.step(s, p[i]); s == dead {
			return false
		}
	}
	return true
}

// Allowed reports whether token id may come next.
func (m *Matcher) Allowed(id int32) bool {
	if m.v == nil || id < 0 || int(id) >= len(m.v.pieces) {
		return false
	}
	return m.allowed()[id>>6]&(1<<(id&63)) != 0
}

// allowed is the current state's mask, computed once per state by walking the vocabulary's
// trie against the automaton.
func (m *Matcher) allowed() []uint64 {
	s := m.a.states[m.cur]
	if s.mask != nil {
		return s.mask
	}
	v := m.v
	if shared := m.g.masks.get(maskKey{v, s.key}); shared != nil {
		s.mask = shared
		return shared
	}
	mask := make([]uint64, (len(v.pieces)+63)/64)
	if s.accept {
		for _, id := range v.stops {
			mask[id>>6] |= 1 << (id & 63)
		}
	}
	walk := append(m.walk[:0], walkItem{0, m.cur})
	for len(walk) > 0 {
		it := walk[len(walk)-1]
		walk = walk[:len(walk)-1]
		src := m.a.states[it.state]
		for c := v.nodes[it.node].child; c >= 0; c = v.nodes[c].sibling {
			nd := &v.nodes[c]
			var t int32
			// the transition table inline (step's fast path): most of a walk is known edges
			if src.next != nil && src.next[nd.b] != unknown {
				t = src.next[nd.b] - 1
				if src.next[nd.b] == dead {
					t = dead
				}
			} else {
				t = m.a.step(it.state, nd.b)
			}
			if t == dead {
				continue
			}
			for _, id := range v.ends[nd.tokStart:nd.tokEnd] {
				mask[id>>6] |= 1 << (id & 63)
			}
			if nd.child >= 0 {
				walk = append(walk, walkItem{c, t})
			}
		}
	}
	m.walk = walk
	s = m.a.states[m.cur]
	s.mask = mask
	m.g.masks.put(maskKey{v, s.key}, mask) // read-only from now on
	return mask
}

// String describes the current state (for errors and tests).
func (m *Matcher) String() string {
	s := m.a.states[m.cur]
	var b strings.Builder
	fmt.Fprintf(&b, "%d stacks", len(s.stacks))
	if s.accept {
		b.WriteString(", can end")
	}
	return b.String()
}
