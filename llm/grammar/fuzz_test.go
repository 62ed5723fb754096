package grammar

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzParse: any text either compiles or fails with ErrSyntax or ErrLeftRecursion, never
// panics; a compiled grammar can be matched against text without panicking, and a matcher over
// a small vocabulary masks consistently with what it accepts.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`root ::= "a"`, JSONGBNF, `root ::= [^"\\]* | "\x41" . ("b"|"c"){2,5}`,
		"root ::= a+ b?\na ::= [a-z] # c\nb ::= \"\\u00e9\"", `root ::= root "a"`, `root ::= ("a"?)*`,
		"root ::= (\n \"x\"\n | \"y\" )", `root ::= "a"{3,}`, `root ::= [`, `x ::= "a"`,
	} {
		f.Add(s, "ab")
	}
	v := NewVocab([]string{"", "a", "b", "ab", "{", "}", "\"", " ", "\xc3", "\xa9", "é", "x"}, []int32{0})
	f.Fuzz(func(t *testing.T, src, text string) {
		g, err := Parse(src)
		if err != nil {
			if !errors.Is(err, ErrSyntax) && !errors.Is(err, ErrLeftRecursion) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		m := NewMatcher(g, nil)
		_ = m.AcceptString(text)
		_ = m.CanEnd()
		mv := NewMatcher(g, v)
		for step := 0; step < 8; step++ {
			logits := make([]float32, v.Size())
			if err := mv.Mask(logits); err != nil {
				if !errors.Is(err, ErrNoToken) {
					t.Fatalf("mask: %v", err)
				}
				return
			}
			picked := int32(-1)
			for i := len(logits) - 1; i >= 0; i-- {
				if logits[i] == 0 {
					picked = int32(i)
					break
				}
			}
			if picked < 0 {
				t.Fatal("mask left no token but returned no error")
			}
			if err := mv.Accept(picked); err != nil {
				t.Fatalf("an allowed token %d was rejected: %v", picked, err)
			}
			if picked == 0 || mv.Done() {
				return
			}
		}
	})
}

// FuzzSchema: any JSON either converts or fails with ErrSchema, never panics, and a converted
// schema's grammar compiles.
func FuzzSchema(f *testing.F) {
	for _, s := range []string{
		`{}`, `true`, `false`, `{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}`,
		`{"type":"array","items":{"enum":[1,"x",null]},"minItems":1,"maxItems":3}`,
		`{"$defs":{"n":{"properties":{"next":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}`,
		`{"anyOf":[{"type":"string","maxLength":3},{"const":{"k":[1]}}]}`,
		`{"properties":{"a b":{}},"additionalProperties":{"type":"boolean"}}`,
		`{"type":["number","null"]}`, `{"$ref":"#/x"}`, `{"pattern":"a"}`, `[`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, schema string) {
		if !json.Valid([]byte(schema)) {
			if _, err := FromSchema([]byte(schema)); !errors.Is(err, ErrSchema) {
				t.Fatalf("invalid JSON: want ErrSchema, got %v", err)
			}
			return
		}
		src, err := SchemaGBNF([]byte(schema))
		if err != nil {
			if !errors.Is(err, ErrSchema) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		if _, err := Parse(src); err != nil && !errors.Is(err, ErrLeftRecursion) {
			t.Fatalf("the generated grammar does not compile: %v\n%s", err, src)
		}
	})
}
