package jinja

import "strings"

type tokKind int

const (
	tokName     tokKind = iota // identifier or keyword
	tokInt                     // integer literal
	tokFloat                   // float literal
	tokString                  // string literal
	tokOp                      // operator (+, -, ==, etc)
	tokComma                   // ,
	tokDot                     // .
	tokColon                   // :
	tokLParen                  // (
	tokRParen                  // )
	tokLBracket                // [
	tokRBracket                // ]
	tokLBrace                  // {
	tokRBrace                  // }
	tokPipe                    // |
	tokTilde                   // ~
	tokPower                   // **
	tokFloorDiv                // //
	tokEOF
)

// twoCharOps are the operators of two characters.
var twoCharOps = map[string]tokKind{
	"**": tokPower, "//": tokFloorDiv, "==": tokOp, "!=": tokOp, "<=": tokOp, ">=": tokOp,
}

// oneCharTokens are the punctuation and operators of one character.
var oneCharTokens = map[byte]tokKind{
	',': tokComma, '.': tokDot, ':': tokColon, '(': tokLParen, ')': tokRParen,
	'[': tokLBracket, ']': tokRBracket, '{': tokLBrace, '}': tokRBrace, '|': tokPipe, '~': tokTilde,
	'+': tokOp, '-': tokOp, '*': tokOp, '/': tokOp, '%': tokOp, '<': tokOp, '>': tokOp, '=': tokOp,
}

type tok struct {
	kind tokKind
	val  string
}

func tokenizeExpr(s string) []tok {
	var tokens []tok
	i := 0

	for i < len(s) {
		ch := s[i]

		// Skip whitespace.
		if ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' {
			i++
			continue
		}

		// String literals.
		if ch == '\'' || ch == '"' {
			quote := ch
			i++
			var b strings.Builder
			for i < len(s) && s[i] != quote {
				if s[i] == '\\' && i+1 < len(s) {
					i++
					switch s[i] {
					case 'n':
						b.WriteByte('\n')
					case 't':
						b.WriteByte('\t')
					case '\\':
						b.WriteByte('\\')
					case '\'':
						b.WriteByte('\'')
					case '"':
						b.WriteByte('"')
					default:
						b.WriteByte('\\')
						b.WriteByte(s[i])
					}
				} else {
					b.WriteByte(s[i])
				}
				i++
			}
			if i < len(s) {
				i++ // skip closing quote
			}
			tokens = append(tokens, tok{kind: tokString, val: b.String()})
			continue
		}

		// Numbers.
		if ch >= '0' && ch <= '9' {
			start := i
			for i < len(s) && s[i] >= '0' && s[i] <= '9' {
				i++
			}
			if i < len(s) && s[i] == '.' && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9' {
				i++
				for i < len(s) && s[i] >= '0' && s[i] <= '9' {
					i++
				}
				// Handle scientific notation.
				if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
					i++
					if i < len(s) && (s[i] == '+' || s[i] == '-') {
						i++
					}
					for i < len(s) && s[i] >= '0' && s[i] <= '9' {
						i++
					}
				}
				tokens = append(tokens, tok{kind: tokFloat, val: s[start:i]})
			} else {
				tokens = append(tokens, tok{kind: tokInt, val: s[start:i]})
			}
			continue
		}

		// Identifiers and keywords.
		if ch == '_' || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') {
			start := i
			for i < len(s) && (s[i] == '_' || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9')) {
				i++
			}
			tokens = append(tokens, tok{kind: tokName, val: s[start:i]})
			continue
		}

		// Two-character operators.
		if i+1 < len(s) {
			if k, ok := twoCharOps[s[i:i+2]]; ok {
				tokens = append(tokens, tok{kind: k, val: s[i : i+2]})
				i += 2
				continue
			}
		}

		// Single-character tokens; an unknown character is skipped.
		if k, ok := oneCharTokens[ch]; ok {
			tokens = append(tokens, tok{kind: k, val: s[i : i+1]})
		}
		i++
	}

	tokens = append(tokens, tok{kind: tokEOF, val: ""})
	return tokens
}
