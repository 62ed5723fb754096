package grammar

import (
	"strings"
	"sync"
)

// The primitive rules JSON grammars share (llama.cpp's json-schema-to-grammar spells them the
// same way). Numbers' digit runs are bounded so that a grammar of bounded values has bounded
// output.
var primitives = map[string]string{
	"space":         `| " " | "\n" [ \t]{0,20}`,
	"boolean":       `("true" | "false") space`,
	"null":          `"null" space`,
	"decimal-part":  `[0-9]{1,16}`,
	"integral-part": `[0] | [1-9] [0-9]{0,15}`,
	"number":        `("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space`,
	"integer":       `("-"? integral-part) space`,
	"char":          `[^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})`,
	"string":        `"\"" char* "\"" space`,
	"value":         `object | array | string | number | boolean | null`,
	"object":        `"{" space ( string ":" space value ("," space string ":" space value)* )? "}" space`,
	"array":         `"[" space ( value ("," space value)* )? "]" space`,
}

// primitiveDeps lists what each primitive refers to, so a grammar carries only what it uses.
var primitiveDeps = map[string][]string{
	"boolean":       {"space"},
	"null":          {"space"},
	"number":        {"integral-part", "decimal-part", "space"},
	"integer":       {"integral-part", "space"},
	"string":        {"char", "space"},
	"value":         {"object", "array", "string", "number", "boolean", "null"},
	"object":        {"space", "string", "value"},
	"array":         {"space", "value"},
	"integral-part": {},
	"decimal-part":  {},
	"char":          {},
	"space":         {},
}

// JSONGBNF is the GBNF of any JSON object (OpenAI's response_format json_object: the answer is
// an object, not any JSON value).
const JSONGBNF = `root ::= object
value ::= object | array | string | number | boolean | null
object ::= "{" space ( string ":" space value ("," space string ":" space value)* )? "}" space
array ::= "[" space ( value ("," space value)* )? "]" space
string ::= "\"" char* "\"" space
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
number ::= ("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space
integral-part ::= [0] | [1-9] [0-9]{0,15}
decimal-part ::= [0-9]{1,16}
boolean ::= ("true" | "false") space
null ::= "null" space
space ::= | " " | "\n" [ \t]{0,20}
`

var jsonOnce = sync.OnceValue(func() *Grammar { return MustParse(JSONGBNF) })

// JSON is the compiled JSONGBNF.
func JSON() *Grammar { return jsonOnce() }

// quote writes s as a GBNF string literal.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7F:
			b.WriteString(`\x`)
			b.WriteString(strings.ToUpper(hex2(byte(r))))
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func hex2(c byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[c>>4], digits[c&15]})
}
