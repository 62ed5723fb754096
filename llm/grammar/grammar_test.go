package grammar

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// matches reports whether the whole text is a sentence of g.
func matches(t testing.TB, g *Grammar, text string) bool {
	m := NewMatcher(g, nil)
	if err := m.AcceptString(text); err != nil {
		return false
	}
	return m.CanEnd()
}

func TestMatcher(t *testing.T) {
	tests := []struct {
		name    string
		gbnf    string
		accept  []string
		reject  []string // whole texts that are not sentences (prefixes or wrong)
		comment string
	}{
		{name: "literal", gbnf: `root ::= "abc"`, accept: []string{"abc"}, reject: []string{"", "ab", "abcd", "abd"}},
		{name: "alternatives", gbnf: `root ::= "a" | "bc" | ""`, accept: []string{"a", "bc", ""}, reject: []string{"b", "ab"}},
		{name: "star", gbnf: `root ::= "a"*`, accept: []string{"", "a", "aaaa"}, reject: []string{"b", "aab"}},
		{name: "plus", gbnf: `root ::= "a"+ "b"`, accept: []string{"ab", "aaab"}, reject: []string{"b", "a"}},
		{name: "optional", gbnf: `root ::= "a"? "b"`, accept: []string{"ab", "b"}, reject: []string{"aab", ""}},
		{name: "exact count", gbnf: `root ::= [0-9]{3}`, accept: []string{"123"}, reject: []string{"12", "1234"}},
		{name: "range count", gbnf: `root ::= [0-9]{1,3}`, accept: []string{"1", "12", "123"}, reject: []string{"", "1234"}},
		{name: "open count", gbnf: `root ::= "x"{2,}`, accept: []string{"xx", "xxxxx"}, reject: []string{"x"}},
		{name: "zero count", gbnf: `root ::= "a" "x"{0} "b"`, accept: []string{"ab"}, reject: []string{"axb"}},
		{name: "class ranges", gbnf: `root ::= [a-cX_]+`, accept: []string{"abcX_", "c"}, reject: []string{"d", "aY"}},
		{name: "negated class", gbnf: `root ::= [^"\\]*`, accept: []string{"hello world", "é"}, reject: []string{`a"`, `\`}},
		{name: "any char", gbnf: `root ::= . .`, accept: []string{"ab", "日本"}, reject: []string{"a", "abc"}},
		{name: "unicode class", gbnf: `root ::= [α-ω]+`, accept: []string{"αβγ"}, reject: []string{"a", "Α"}},
		{name: "escapes", gbnf: `root ::= "\x41\u00e9\n\t\"\\" [\x30-\x39]`, accept: []string{"Aé\n\t\"\\5"}, reject: []string{"Ae\n\t\"\\5"}},
		{name: "groups", gbnf: `root ::= ("ab" | "c")* "d"`, accept: []string{"d", "abcd", "ccabd"}, reject: []string{"ad", "abc"}},
		{name: "rules and comments", gbnf: "# a comment\nroot ::= greet \" \" name # trailing\ngreet ::= \"hi\" | \"hello\"\nname ::= [a-z]+\n",
			accept: []string{"hi bob", "hello x"}, reject: []string{"hi", "hey bob"}},
		{name: "multi-line group", gbnf: "root ::= (\n  \"a\"\n  | \"b\"\n)\n", accept: []string{"a", "b"}, reject: []string{"ab"}},
		{name: "continuation line", gbnf: "root ::= \"a\"\n  | \"b\"\nother ::= \"c\"\n", accept: []string{"a", "b"}, reject: []string{"c"}},
		{name: "right recursion", gbnf: `root ::= "(" root ")" | ""`, accept: []string{"", "()", "((()))"}, reject: []string{"(()", ")("}},
		{name: "empty rule body", gbnf: "root ::= a \"x\"\na ::=\nb ::= \"y\"\n", accept: []string{"x"}, reject: []string{"ax"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := Parse(tt.gbnf)
			require.NoError(t, err)
			for _, s := range tt.accept {
				assert.True(t, matches(t, g, s), "should accept %q", s)
			}
			for _, s := range tt.reject {
				assert.False(t, matches(t, g, s), "should reject %q", s)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, gbnf string
		want       error
		msg        string
	}{
		{"no root", `a ::= "x"`, ErrSyntax, "no rule named root"},
		{"undefined", `root ::= missing`, ErrSyntax, `undefined rule "missing"`},
		{"unterminated", `root ::= "abc`, ErrSyntax, "unterminated string"},
		{"class", `root ::= [abc`, ErrSyntax, "unterminated character class"},
		{"group", `root ::= ("a"`, ErrSyntax, "expected )"},
		{"no ::=", `root = "a"`, ErrSyntax, "expected ::="},
		{"bad escape", `root ::= "\q"`, ErrSyntax, `unknown escape`},
		{"reversed range", `root ::= [z-a]`, ErrSyntax, "reversed"},
		{"bad count", `root ::= "a"{3,1}`, ErrSyntax, "below the minimum"},
		{"huge count", `root ::= "a"{99999}`, ErrSyntax, "at most"},
		{"duplicate", "root ::= \"a\"\nroot ::= \"b\"", ErrSyntax, "defined twice"},
		{"empty", "# nothing\n", ErrSyntax, "no rules"},
		{"left recursion", `root ::= root "a" | "a"`, ErrLeftRecursion, `"root"`},
		{"indirect left recursion", "root ::= a\na ::= b? root \"x\"\nb ::= \"b\"", ErrLeftRecursion, "root -> a -> root"},
		{"nullable star", `root ::= ("a"?)*`, ErrLeftRecursion, "reach itself"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.gbnf)
			require.ErrorIs(t, err, tt.want)
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
}

func TestJSONGrammar(t *testing.T) {
	g := JSON()
	for _, s := range []string{`{}`, `{"a": 1}`, `{"a":[1,2.5e3,"x",true,null,{"b":{}}]}`, "{\n  \"k\": \"\\u00e9\\n\"\n}"} {
		assert.True(t, matches(t, g, s), "accept %s", s)
	}
	for _, s := range []string{`[]`, `{`, `{"a"}`, `{"a":01}`, `{'a':1}`, `{"a":1,}`, "\"x\"", `{"a":"` + "\x01" + `"}`} {
		assert.False(t, matches(t, g, s), "reject %s", s)
	}
}

func testVocab() (*Vocab, []string) {
	pieces := []string{"", "{", "}", "\"", "a", "ab", " ", "{\"", "\"}", ":", "1", "12", "x", "日", "\xe6", "\x97\xa5", "\xff", "", "\xf0"}
	return NewVocab(pieces, []int32{0}), pieces
}

func allowedSet(m *Matcher, n int) []string {
	// the cheap check (before the state's mask exists) agrees with the mask
	allows := make([]bool, n)
	for i := range allows {
		allows[i] = m.Allows(int32(i))
	}
	logits := make([]float32, n)
	if err := m.Mask(logits); err != nil {
		return nil
	}
	for i, l := range logits {
		if allows[i] != !math.IsInf(float64(l), -1) {
			return []string{fmt.Sprintf("Allows(%d) = %v disagrees with the mask", i, allows[i])}
		}
	}
	var out []string
	_, pieces := testVocab()
	for i, l := range logits {
		if !math.IsInf(float64(l), -1) {
			if i == 0 {
				out = append(out, "<eos>")
			} else {
				out = append(out, pieces[i])
			}
		}
	}
	return out
}

func TestMask(t *testing.T) {
	v, pieces := testVocab()
	g, err := Parse(`root ::= "{" "\"" [a-b]+ "\"" ":" [0-9]+ "}" | "日" "x"`)
	require.NoError(t, err)
	m := NewMatcher(g, v)
	n := len(pieces)
	assert.Equal(t, []string{"{", "{\"", "日", "\xe6"}, allowedSet(m, n))
	require.NoError(t, m.Accept(7)) // {"
	assert.Equal(t, []string{"a", "ab"}, allowedSet(m, n))
	require.NoError(t, m.Accept(5))
	assert.Equal(t, []string{"\"", "a", "ab"}, allowedSet(m, n))
	require.ErrorIs(t, m.Accept(2), ErrRejected, "} cannot close a string")
	require.ErrorIs(t, m.Accept(0), ErrRejected, "end of generation inside the grammar")
	require.NoError(t, m.Accept(3))
	require.NoError(t, m.Accept(9))
	require.NoError(t, m.Accept(11))
	assert.Equal(t, []string{"}", "1", "12"}, allowedSet(m, n))
	assert.False(t, m.CanEnd())
	require.NoError(t, m.Accept(2))
	assert.True(t, m.CanEnd())
	assert.True(t, m.Done())
	assert.Equal(t, []string{"<eos>"}, allowedSet(m, n), "only the stop token once complete")
	require.NoError(t, m.Accept(0))

	// a UTF-8 character split over two tokens
	m.Reset()
	require.NoError(t, m.Accept(14))
	assert.Equal(t, []string{"\x97\xa5"}, allowedSet(m, n))
	require.NoError(t, m.Accept(15))
	assert.Equal(t, []string{"x"}, allowedSet(m, n))

	// logits longer than the vocabulary: the rest is masked
	m.Reset()
	logits := make([]float32, n+3)
	require.NoError(t, m.Mask(logits))
	assert.True(t, math.IsInf(float64(logits[n+1]), -1))
}

func TestMaskNoToken(t *testing.T) {
	v := NewVocab([]string{"", "a"}, []int32{0})
	m := NewMatcher(MustParse(`root ::= "b"`), v)
	logits := []float32{1, 2}
	require.ErrorIs(t, m.Mask(logits), ErrNoToken)
	assert.Equal(t, []float32{1, 2}, logits, "left alone")
}

func TestSchemaGrammar(t *testing.T) {
	schema := `{
	  "type": "object",
	  "properties": {
	    "name": {"type": "string", "maxLength": 5},
	    "age": {"type": "integer"},
	    "mood": {"enum": ["happy", "sad", 3]},
	    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
	    "pos": {"$ref": "#/$defs/point"},
	    "kind": {"const": "cat"},
	    "maybe": {"anyOf": [{"type": "null"}, {"type": "number"}]},
	    "opt": {"type": "boolean"}
	  },
	  "required": ["name", "age", "mood", "tags", "pos", "kind"],
	  "additionalProperties": false,
	  "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x"]}}
	}`
	g, err := FromSchema([]byte(schema))
	require.NoError(t, err)
	ok := []string{
		`{"name":"bob","age":3,"mood":"sad","tags":["a"],"pos":{"x":1},"kind":"cat"}`,
		`{ "name": "", "age": -12, "mood": 3, "tags": ["a", "b"], "pos": {"x": 1.5, "y": 2e3}, "kind": "cat", "maybe": null, "opt": true }`,
		`{"name":"bob","age":3,"mood":"sad","tags":["a"],"pos":{"x":1},"kind":"cat","opt":false}`,
	}
	bad := []string{
		`{"name":"bobbyx","age":3,"mood":"sad","tags":["a"],"pos":{"x":1},"kind":"cat"}`, // too long
		`{"name":"bob","age":3.5,"mood":"sad","tags":["a"],"pos":{"x":1},"kind":"cat"}`,  // not an integer
		`{"name":"bob","age":3,"mood":"glad","tags":["a"],"pos":{"x":1},"kind":"cat"}`,   // not in enum
		`{"name":"bob","age":3,"mood":"sad","tags":[],"pos":{"x":1},"kind":"cat"}`,       // minItems
		`{"name":"bob","age":3,"mood":"sad","tags":["a","b","c"],"pos":{"x":1},"kind":"cat"}`,
		`{"name":"bob","age":3,"mood":"sad","tags":["a"],"pos":{"y":1},"kind":"cat"}`, // x required
		`{"name":"bob","age":3,"mood":"sad","tags":["a"],"pos":{"x":1},"kind":"dog"}`,
		`{"name":"bob","age":3,"mood":"sad","tags":["a"],"pos":{"x":1},"kind":"cat","extra":1}`,
		`{"age":3,"name":"bob","mood":"sad","tags":["a"],"pos":{"x":1},"kind":"cat"}`, // order
	}
	for _, s := range ok {
		require.True(t, json.Valid([]byte(s)))
		assert.True(t, matches(t, g, s), "accept %s", s)
	}
	for _, s := range bad {
		assert.False(t, matches(t, g, s), "reject %s", s)
	}
}

func TestSchemaForms(t *testing.T) {
	tests := []struct {
		name, schema string
		accept       []string
		reject       []string
	}{
		{"any", `{}`, []string{`1`, `"x"`, `{"a":[]}`}, []string{`x`}},
		{"true", `true`, []string{`null`}, []string{`nul`}},
		{"type list", `{"type":["string","null"]}`, []string{`"a"`, `null`}, []string{`1`}},
		{"any object", `{"type":"object"}`, []string{`{}`, `{"a":1}`}, []string{`[]`}},
		{"additional schema", `{"type":"object","additionalProperties":{"type":"integer"}}`, []string{`{}`, `{"a":1,"b":2}`}, []string{`{"a":"x"}`}},
		{"optional only", `{"properties":{"a":{"type":"integer"},"b":{"type":"integer"}}}`,
			[]string{`{}`, `{"a":1}`, `{"b":2}`, `{"a":1,"b":2}`}, []string{`{"b":1,"a":2}`, `{,"b":1}`}},
		{"props and additional", `{"properties":{"a":{"type":"integer"}},"additionalProperties":true}`,
			[]string{`{}`, `{"a":1}`, `{"z":"q"}`, `{"aa":"q"}`, `{"":"q"}`, `{"a":1,"z":[]}`}, []string{`{"a":"x"}`}},
		{"recursive", `{"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}`,
			[]string{`{}`, `{"next":{"next":{}}}`}, []string{`{"next":1}`}},
		{"root ref", `{"type":"object","properties":{"child":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["child"]}`,
			[]string{`{"child":null}`, `{"child":{"child":null}}`}, []string{`{}`}},
		{"array min", `{"type":"array","items":{"type":"boolean"},"minItems":2}`, []string{`[true,false]`, `[true,true,true]`}, []string{`[true]`, `[]`}},
		{"array max", `{"type":"array","maxItems":1}`, []string{`[]`, `[1]`}, []string{`[1,2]`}},
		{"string min", `{"type":"string","minLength":2}`, []string{`"ab"`, `"abc"`}, []string{`"a"`}},
		{"enum object", `{"enum":[{"a":1},[1,2],"x\"y"]}`, []string{`{"a":1}`, `[1,2]`, `"x\"y"`}, []string{`{"a":2}`}},
		{"allOf one", `{"allOf":[{"type":"integer"}],"title":"t","description":"d","format":"int32"}`, []string{`5`}, []string{`"5"`}},
		{"html characters", `{"properties":{"a<b":{"const":"x&y"}},"required":["a<b"]}`, []string{`{"a<b":"x&y"}`}, []string{`{"a\u003cb":"x\u0026y"}`}},
		{"required not in properties", `{"type":"object","required":["a"]}`, []string{`{"a":{}}`}, []string{`{}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := FromSchema([]byte(tt.schema))
			require.NoError(t, err)
			for _, s := range tt.accept {
				assert.True(t, matches(t, g, s), "accept %s", s)
			}
			for _, s := range tt.reject {
				assert.False(t, matches(t, g, s), "reject %s", s)
			}
		})
	}
}

func TestSchemaErrors(t *testing.T) {
	tests := []struct{ name, schema, msg string }{
		{"not json", `{`, "not valid JSON"},
		{"trailing", `{} x`, "trailing"},
		{"false", `false`, "matches nothing"},
		{"number", `3`, "must be an object or a boolean"},
		{"pattern", `{"type":"string","pattern":"a+"}`, `keyword "pattern" is not supported`},
		{"nested minimum", `{"properties":{"a":{"type":"integer","minimum":0}}}`, `at #/properties/a: keyword "minimum"`},
		{"unknown type", `{"type":"strin"}`, `unknown type "strin"`},
		{"bad ref", `{"$ref":"#/$defs/none"}`, `"#/$defs/none"`},
		{"remote ref", `{"$ref":"http://x/y.json"}`, "only references inside the schema"},
		{"self ref", `{"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`, "reach itself"},
		{"empty enum", `{"enum":[]}`, "non-empty array"},
		{"huge maxItems", `{"type":"array","maxItems":100000}`, "at most 1000"},
		{"negative", `{"type":"string","maxLength":-1}`, "non-negative integer"},
		{"min over max", `{"type":"array","minItems":3,"maxItems":2}`, "below minItems"},
		{"allOf two", `{"allOf":[{},{}]}`, "allOf is supported with one schema only"},
		{"bad properties", `{"properties":[]}`, "properties must be an object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := FromSchema([]byte(tt.schema))
			require.ErrorIs(t, err, ErrSchema)
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
}

func TestQuote(t *testing.T) {
	for _, s := range []string{"plain", `a"b\c`, "line\nbreak\ttab\r", "\x01\x7f", "日本", ""} {
		g, err := Parse("root ::= " + quote(s))
		require.NoError(t, err, s)
		assert.True(t, matches(t, g, s), "%q", s)
		if s != "" {
			assert.False(t, matches(t, g, s+"x"))
		}
	}
	assert.False(t, strings.Contains(quote("\n"), "\n"))
}
