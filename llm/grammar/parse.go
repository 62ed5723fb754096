// Package grammar constrains generation to a formal grammar: GBNF as llama.cpp writes it,
// JSON Schema converted to GBNF, and a built-in JSON grammar.
//
// Parse compiles GBNF text into a Grammar (repetitions expanded into right-recursive rules, as
// llama.cpp does, so that a stack-based pushdown matcher runs it; left recursion is refused at
// parse time). A Matcher follows one generation: Mask forbids the tokens that would take the
// text outside the grammar, Accept advances over the sampled token. The matcher builds a
// deterministic automaton over bytes lazily (one state per distinct set of parse stacks) and
// walks a trie of the vocabulary's token strings against it, caching each state's mask, so a
// step that returns to a state already seen costs one pass over the logits.
package grammar

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// ErrSyntax wraps every GBNF parse error.
var ErrSyntax = errors.New("grammar: syntax error")

// ErrLeftRecursion is returned by Parse for a grammar a pushdown matcher cannot run.
var ErrLeftRecursion = errors.New("grammar: left recursion")

// maxRepeat bounds {m,n} counts: each repetition is a copy of the element.
const maxRepeat = 10000

// maxElems bounds the compiled grammar (nested repetitions multiply).
const maxElems = 1 << 20

type elemKind uint8

const (
	kEnd  elemKind = iota // end of an alternative
	kRef                  // a rule reference
	kChar                 // one character from a set
)

type runeRange struct{ lo, hi rune }

// elem is one position of an alternative.
type elem struct {
	kind   elemKind
	rule   int32       // kRef
	ranges []runeRange // kChar
	neg    bool        // kChar: matches the runes outside ranges
}

func (e *elem) matches(r rune) bool {
	for _, rg := range e.ranges {
		if r >= rg.lo && r <= rg.hi {
			return !e.neg
		}
	}
	return e.neg
}

// Grammar is a compiled grammar. It is safe for concurrent use: its rules are immutable and
// the masks its matchers share are kept under a lock.
type Grammar struct {
	elems []elem    // every alternative, each ended by kEnd
	alts  [][]int32 // rule -> the positions its alternatives start at
	names []string  // rule names (generated rules are named after the rule they came from)
	root  int32
	masks maskCache // masks per vocabulary and state, shared by the grammar's matchers
}

// maxSharedMasks bounds the masks a grammar keeps for its matchers (a recursive grammar has
// no bound on its states).
const maxSharedMasks = 4096

// maskCache holds the masks the grammar's matchers computed, so that a later generation with
// the same grammar (serve's repeated schema, the built-in JSON grammar) starts warm.
type maskCache struct {
	mu sync.Mutex
	m  map[maskKey][]uint64
}

type maskKey struct {
	v     *Vocab
	state string
}

func (c *maskCache) get(k maskKey) []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[k]
}

func (c *maskCache) put(k maskKey, mask []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[maskKey][]uint64{}
	}
	if len(c.m) < maxSharedMasks {
		c.m[k] = mask
	}
}

// Rules is the number of rules (generated ones included).
func (g *Grammar) Rules() int { return len(g.alts) }

// Parse compiles GBNF text. The start rule is "root".
func Parse(src string) (*Grammar, error) {
	p := &parser{src: src, ids: map[string]int32{}}
	if err := p.parse(); err != nil {
		return nil, err
	}
	return p.compile()
}

// MustParse is Parse for grammars known to be valid (the built-in ones); it panics otherwise.
func MustParse(src string) *Grammar {
	g, err := Parse(src)
	if err != nil {
		panic(err)
	}
	return g
}

// The parse tree, before flattening.
type node struct {
	kind   uint8 // nLit (ranges+neg: one char), nRef, nGroup, nRepeat
	ranges []runeRange
	neg    bool
	ref    string
	line   int
	alts   [][]*node // nGroup
	sub    *node     // nRepeat
	min    int
	max    int // -1: no bound
}

const (
	nChar uint8 = iota
	nRef
	nGroup
	nRepeat
)

type ruleDef struct {
	name string
	alts [][]*node
	line int
}

type parser struct {
	src   string
	pos   int
	rules []ruleDef
	ids   map[string]int32
}

func (p *parser) line() int { return strings.Count(p.src[:p.pos], "\n") + 1 }

func (p *parser) errf(format string, args ...any) error {
	return fmt.Errorf("%w: line %d: %s", ErrSyntax, p.line(), fmt.Sprintf(format, args...))
}

func isWordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// space skips blanks and comments; newlines only when newlines is set.
func (p *parser) space(newlines bool) {
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		switch {
		case c == ' ' || c == '\t':
			p.pos++
		case c == '#':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' {
				p.pos++
			}
		case (c == '\n' || c == '\r') && newlines:
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) name() string {
	start := p.pos
	for p.pos < len(p.src) && isWordByte(p.src[p.pos]) {
		p.pos++
	}
	return p.src[start:p.pos]
}

func (p *parser) parse() error {
	for {
		p.space(true)
		if p.pos >= len(p.src) {
			break
		}
		line := p.line()
		name := p.name()
		if name == "" {
			return p.errf("expected a rule name, found %q", p.peekText())
		}
		p.space(false)
		if !strings.HasPrefix(p.src[p.pos:], "::=") {
			return p.errf("expected ::= after %q", name)
		}
		p.pos += 3
		p.space(true)
		alts, err := p.alternatives(false)
		if err != nil {
			return err
		}
		if _, dup := p.ids[name]; dup {
			return p.errf("rule %q defined twice", name)
		}
		p.ids[name] = int32(len(p.rules))
		p.rules = append(p.rules, ruleDef{name: name, alts: alts, line: line})
		if p.pos < len(p.src) && p.src[p.pos] != '\n' && p.src[p.pos] != '\r' && !p.atLineStart() {
			return p.errf("expected the end of the line after rule %q, found %q", name, p.peekText())
		}
	}
	if len(p.rules) == 0 {
		return fmt.Errorf("%w: no rules", ErrSyntax)
	}
	return nil
}

// atLineStart reports whether only blanks precede pos on its line.
func (p *parser) atLineStart() bool {
	for i := p.pos - 1; i >= 0; i-- {
		switch p.src[i] {
		case '\n':
			return true
		case ' ', '\t', '\r':
		default:
			return false
		}
	}
	return true
}

func (p *parser) peekText() string {
	end := min(len(p.src), p.pos+16)
	return p.src[p.pos:end]
}

// alternatives parses seq ("|" seq)*. At the top level (nested false) a sequence ends at the
// end of the line, but a line that starts with "|" continues the rule.
func (p *parser) alternatives(nested bool) ([][]*node, error) {
	var alts [][]*node
	for {
		seq, err := p.sequence(nested)
		if err != nil {
			return nil, err
		}
		alts = append(alts, seq)
		if !nested {
			save := p.pos
			p.space(true)
			if p.pos < len(p.src) && p.src[p.pos] == '|' {
				// continuation line
			} else {
				p.pos = save
			}
		}
		if p.pos >= len(p.src) || p.src[p.pos] != '|' {
			return alts, nil
		}
		p.pos++
		p.space(true)
	}
}

func (p *parser) sequence(nested bool) ([]*node, error) {
	var seq []*node
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		var n *node
		switch {
		case c == '"':
			p.pos++
			lit, err := p.literal()
			if err != nil {
				return nil, err
			}
			if len(lit) == 0 {
				// an empty literal matches the empty string: a group with one empty alternative
				n = &node{kind: nGroup, alts: [][]*node{nil}}
			} else if len(lit) == 1 {
				n = lit[0]
			} else {
				n = &node{kind: nGroup, alts: [][]*node{lit}}
			}
		case c == '[':
			p.pos++
			cls, err := p.class()
			if err != nil {
				return nil, err
			}
			n = cls
		case c == '.':
			p.pos++
			n = &node{kind: nChar, neg: true}
		case c == '(':
			p.pos++
			p.space(true)
			alts, err := p.alternatives(true)
			if err != nil {
				return nil, err
			}
			if p.pos >= len(p.src) || p.src[p.pos] != ')' {
				return nil, p.errf("expected ) to close a group")
			}
			p.pos++
			n = &node{kind: nGroup, alts: alts}
		case isWordByte(c):
			line := p.line()
			name := p.name()
			save := p.pos
			p.space(true)
			if strings.HasPrefix(p.src[p.pos:], "::=") {
				// the next rule starts here: this (empty) sequence ended at the previous line
				p.pos = save - len(name)
				return seq, nil
			}
			p.pos = save
			n = &node{kind: nRef, ref: name, line: line}
		default:
			goto done
		}
		// postfix operators
		for p.pos < len(p.src) {
			op := p.src[p.pos]
			if op == '*' || op == '+' || op == '?' {
				p.pos++
				mn, mx := 0, -1
				switch op {
				case '+':
					mn = 1
				case '?':
					mx = 1
				}
				n = &node{kind: nRepeat, sub: n, min: mn, max: mx}
				continue
			}
			if op == '{' {
				p.pos++
				mn, mx, err := p.braces()
				if err != nil {
					return nil, err
				}
				n = &node{kind: nRepeat, sub: n, min: mn, max: mx}
				continue
			}
			break
		}
		seq = append(seq, n)
		p.space(nested)
	}
done:
	return seq, nil
}

// braces parses m}, m,}, m,n} after "{".
func (p *parser) braces() (int, int, error) {
	p.space(false)
	num := func() (int, bool, error) {
		start := p.pos
		for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
			p.pos++
		}
		if start == p.pos {
			return 0, false, nil
		}
		v, err := strconv.Atoi(p.src[start:p.pos])
		if err != nil || v > maxRepeat {
			return 0, false, p.errf("repetition count %s: at most %d", p.src[start:p.pos], maxRepeat)
		}
		return v, true, nil
	}
	mn, ok, err := num()
	if err != nil {
		return 0, 0, err
	}
	if !ok {
		return 0, 0, p.errf("expected a number after {")
	}
	p.space(false)
	mx := mn
	if p.pos < len(p.src) && p.src[p.pos] == ',' {
		p.pos++
		p.space(false)
		v, ok, err := num()
		if err != nil {
			return 0, 0, err
		}
		mx = -1
		if ok {
			mx = v
		}
		p.space(false)
	}
	if p.pos >= len(p.src) || p.src[p.pos] != '}' {
		return 0, 0, p.errf("expected } to close a repetition")
	}
	p.pos++
	if mx >= 0 && mx < mn {
		return 0, 0, p.errf("repetition {%d,%d}: the maximum is below the minimum", mn, mx)
	}
	return mn, mx, nil
}

// char reads one character of a literal or class, decoding escapes.
func (p *parser) char() (rune, error) {
	if p.pos >= len(p.src) {
		return 0, p.errf("unexpected end of input")
	}
	c := p.src[p.pos]
	if c != '\\' {
		r, n := utf8.DecodeRuneInString(p.src[p.pos:])
		if r == utf8.RuneError && n <= 1 {
			return 0, p.errf("invalid UTF-8")
		}
		p.pos += n
		return r, nil
	}
	p.pos++
	if p.pos >= len(p.src) {
		return 0, p.errf("unexpected end of input after \\")
	}
	e := p.src[p.pos]
	p.pos++
	hex := func(n int) (rune, error) {
		if p.pos+n > len(p.src) {
			return 0, p.errf("escape \\%c needs %d hex digits", e, n)
		}
		v, err := strconv.ParseUint(p.src[p.pos:p.pos+n], 16, 32)
		if err != nil {
			return 0, p.errf("escape \\%c%s: bad hex digits", e, p.src[p.pos:p.pos+n])
		}
		p.pos += n
		if v > utf8.MaxRune {
			return 0, p.errf("escape \\%c: code point %#x out of range", e, v)
		}
		return rune(v), nil
	}
	switch e {
	case 'x':
		return hex(2)
	case 'u':
		return hex(4)
	case 'U':
		return hex(8)
	case 't':
		return '\t', nil
	case 'r':
		return '\r', nil
	case 'n':
		return '\n', nil
	case '\\', '"', '[', ']', '-', '^', '\'':
		return rune(e), nil
	}
	return 0, p.errf("unknown escape \\%c", e)
}

func (p *parser) literal() ([]*node, error) {
	var out []*node
	for {
		if p.pos >= len(p.src) || p.src[p.pos] == '\n' {
			return nil, p.errf("unterminated string literal")
		}
		if p.src[p.pos] == '"' {
			p.pos++
			return out, nil
		}
		r, err := p.char()
		if err != nil {
			return nil, err
		}
		out = append(out, &node{kind: nChar, ranges: []runeRange{{r, r}}})
	}
}

func (p *parser) class() (*node, error) {
	n := &node{kind: nChar}
	if p.pos < len(p.src) && p.src[p.pos] == '^' {
		n.neg = true
		p.pos++
	}
	for {
		if p.pos >= len(p.src) || p.src[p.pos] == '\n' {
			return nil, p.errf("unterminated character class")
		}
		if p.src[p.pos] == ']' {
			p.pos++
			return n, nil
		}
		lo, err := p.char()
		if err != nil {
			return nil, err
		}
		hi := lo
		if p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
			p.pos++
			if hi, err = p.char(); err != nil {
				return nil, err
			}
			if hi < lo {
				return nil, p.errf("character range %q-%q is reversed", lo, hi)
			}
		}
		n.ranges = append(n.ranges, runeRange{lo, hi})
	}
}

// compiler flattens the parse tree.
type compiler struct {
	size  int // elements made so far
	p     *parser
	g     *Grammar
	rules [][][]elem // rule -> alternatives -> elements (without kEnd)
	names []string
}

func (p *parser) compile() (*Grammar, error) {
	c := &compiler{p: p}
	for _, r := range p.rules {
		c.rules = append(c.rules, nil)
		c.names = append(c.names, r.name)
	}
	for i, r := range p.rules {
		alts := make([][]elem, 0, len(r.alts))
		for _, seq := range r.alts {
			s, err := c.seq(seq, r.name)
			if err != nil {
				return nil, err
			}
			alts = append(alts, s)
		}
		c.rules[i] = alts
	}
	root, ok := p.ids["root"]
	if !ok {
		return nil, fmt.Errorf("%w: no rule named root", ErrSyntax)
	}
	g := &Grammar{root: root, names: c.names}
	for _, alts := range c.rules {
		var starts []int32
		for _, a := range alts {
			starts = append(starts, int32(len(g.elems)))
			g.elems = append(g.elems, a...)
			g.elems = append(g.elems, elem{kind: kEnd})
		}
		g.alts = append(g.alts, starts)
	}
	if err := g.checkLeftRecursion(); err != nil {
		return nil, err
	}
	return g, nil
}

// newRule adds a generated rule and returns its id.
func (c *compiler) newRule(base string, alts [][]elem) int32 {
	id := int32(len(c.rules))
	c.rules = append(c.rules, alts)
	c.names = append(c.names, fmt.Sprintf("%s-%d", base, id))
	return id
}

func (c *compiler) seq(seq []*node, base string) ([]elem, error) {
	var out []elem
	for _, n := range seq {
		es, err := c.node(n, base)
		if err != nil {
			return nil, err
		}
		out = append(out, es...)
	}
	return out, nil
}

func (c *compiler) node(n *node, base string) ([]elem, error) {
	switch n.kind {
	case nChar:
		return []elem{{kind: kChar, ranges: n.ranges, neg: n.neg}}, nil
	case nRef:
		id, ok := c.p.ids[n.ref]
		if !ok {
			return nil, fmt.Errorf("%w: line %d: undefined rule %q", ErrSyntax, n.line, n.ref)
		}
		return []elem{{kind: kRef, rule: id}}, nil
	case nGroup:
		if len(n.alts) == 1 {
			return c.seq(n.alts[0], base)
		}
		var alts [][]elem
		for _, a := range n.alts {
			s, err := c.seq(a, base)
			if err != nil {
				return nil, err
			}
			alts = append(alts, s)
		}
		return []elem{{kind: kRef, rule: c.newRule(base, alts)}}, nil
	case nRepeat:
		sub, err := c.node(n.sub, base)
		if err != nil {
			return nil, err
		}
		copies := max(n.min, n.max) + 1
		if c.size += len(sub) * copies; c.size > maxElems {
			return nil, fmt.Errorf("%w: the grammar expands to more than %d elements (nested repetitions?)", ErrSyntax, maxElems)
		}
		return c.repeat(sub, n.min, n.max, base), nil
	}
	return nil, fmt.Errorf("%w: unknown node", ErrSyntax)
}

// repeat expands x{min,max} as llama.cpp does: min copies, then x* (no bound) or max-min
// nested optionals x (x (x)?)?.
func (c *compiler) repeat(x []elem, mn, mx int, base string) []elem {
	var out []elem
	for range mn {
		out = append(out, x...)
	}
	if mx == mn {
		return out
	}
	if mx < 0 {
		// star ::= x star |
		id := int32(len(c.rules))
		star := c.newRule(base, nil)
		c.rules[id] = [][]elem{append(append([]elem{}, x...), elem{kind: kRef, rule: star}), nil}
		return append(out, elem{kind: kRef, rule: star})
	}
	// opt_k ::= x opt_{k-1} | ; built from the innermost out
	var inner []elem
	for range mx - mn {
		alt := append(append([]elem{}, x...), inner...)
		inner = []elem{{kind: kRef, rule: c.newRule(base, [][]elem{alt, nil})}}
	}
	return append(out, inner...)
}

// checkLeftRecursion refuses a rule that can reach itself without consuming a character: the
// matcher would expand it forever.
func (g *Grammar) checkLeftRecursion() error {
	n := len(g.alts)
	nullable := make([]bool, n)
	for changed := true; changed; {
		changed = false
		for r := range n {
			if nullable[r] {
				continue
			}
			for _, start := range g.alts[r] {
				if g.nullableFrom(start, nullable) {
					nullable[r], changed = true, true
					break
				}
			}
		}
	}
	// edges: r -> s when s can come first in r
	edges := make([][]int32, n)
	for r := range n {
		for _, start := range g.alts[r] {
			for pos := start; g.elems[pos].kind == kRef; pos++ {
				edges[r] = append(edges[r], g.elems[pos].rule)
				if !nullable[g.elems[pos].rule] {
					break
				}
			}
		}
	}
	const (
		white = iota
		grey
		black
	)
	color := make([]uint8, n)
	var path []int32
	var visit func(r int32) error
	visit = func(r int32) error {
		color[r] = grey
		path = append(path, r)
		for _, s := range edges[r] {
			switch color[s] {
			case grey:
				var names []string
				for i := len(path) - 1; i >= 0; i-- {
					names = append([]string{g.names[path[i]]}, names...)
					if path[i] == s {
						break
					}
				}
				names = append(names, g.names[s])
				return fmt.Errorf("%w: rule %q can reach itself before matching a character (%s)",
					ErrLeftRecursion, g.names[s], strings.Join(names, " -> "))
			case white:
				if err := visit(s); err != nil {
					return err
				}
			}
		}
		path = path[:len(path)-1]
		color[r] = black
		return nil
	}
	for r := range n {
		if color[r] == white {
			if err := visit(int32(r)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (g *Grammar) nullableFrom(pos int32, nullable []bool) bool {
	for ; g.elems[pos].kind != kEnd; pos++ {
		e := &g.elems[pos]
		if e.kind == kChar || !nullable[e.rule] {
			return false
		}
	}
	return true
}
