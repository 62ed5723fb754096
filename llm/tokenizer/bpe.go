package tokenizer

import (
	"strings"
	"unicode"
)

// byteToRune is GPT-2's reversible byte-to-character map: printable Latin-1 bytes map to
// themselves, the rest to U+0100 onwards, so every byte string is a visible token string.
var byteToRune [256]rune

var runeToByte = map[rune]byte{}

func init() {
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// encodeBPEWord maps one pre-token's bytes to byte-level characters and applies the merges in
// rank order.
func (t *Tokenizer) encodeBPEWord(out []int32, word string) []int32 {
	syms := make([]string, 0, len(word))
	for i := 0; i < len(word); i++ {
		syms = append(syms, string(byteToRune[word[i]]))
	}
	if t.ignoreMerges && len(syms) > 1 {
		if id, ok := t.index[strings.Join(syms, "")]; ok {
			return append(out, id)
		}
	}
	for len(syms) > 1 {
		best, bestRank := -1, int(^uint(0)>>1)
		for i := 0; i+1 < len(syms); i++ {
			if r, ok := t.ranks[[2]string{syms[i], syms[i+1]}]; ok && r < bestRank {
				best, bestRank = i, r
			}
		}
		if best < 0 {
			break
		}
		syms[best] += syms[best+1]
		syms = append(syms[:best+1], syms[best+2:]...)
	}
	for _, s := range syms {
		if id, ok := t.index[s]; ok {
			out = append(out, id)
			continue
		}
		// A merge result missing from the vocabulary: fall back to its bytes.
		for _, r := range s {
			if b, ok := runeToByte[r]; ok && t.bytes[b] >= 0 {
				out = append(out, t.bytes[b])
			} else if t.v.UNK >= 0 {
				out = append(out, t.v.UNK)
			}
		}
	}
	return out
}

// handSplitter is a hand-written equivalent of the GPT-2 pattern (gpt2) or of the Llama 3 and
// Qwen2 patterns (maxDigits 3 or 1), the pre-tokenizers of most models.
type handSplitter struct {
	// maxDigits bounds a run of digits (\p{N}{1,3} for Llama 3, \p{N} for Qwen2, 0 = unbounded).
	maxDigits int
	// gpt2 selects the original GPT-2 pattern: ' ?\p{L}+| ?\p{N}+' with case-sensitive
	// contractions; otherwise the Llama 3 family ('[^\r\n\p{L}\p{N}]?\p{L}+', '\s*[\r\n]+').
	gpt2 bool
}

// step splits the piece rs[p[0]:p[1]] as the pattern does (the pattern sees only the piece).
func (h handSplitter) step(rs []rune, p [2]int, out [][2]int) [][2]int {
	piece := rs[p[0]:p[1]]
	for i := 0; i < len(piece); {
		n := h.match(piece, i)
		out = append(out, [2]int{p[0] + i, p[0] + i + n})
		i += n
	}
	return out
}

func isL(r rune) bool     { return unicode.IsLetter(r) }
func isN(r rune) bool     { return unicode.IsNumber(r) }
func isS(r rune) bool     { return unicode.IsSpace(r) }
func isCRLF(r rune) bool  { return r == '\r' || r == '\n' }
func isPunct(r rune) bool { return !isS(r) && !isL(r) && !isN(r) }

// match returns the length (≥ 1) of the token starting at i.
func (p handSplitter) match(rs []rune, i int) int {
	at := func(j int) rune {
		if j < len(rs) {
			return rs[j]
		}
		return -1
	}
	run := func(j int, f func(rune) bool, max int) int {
		k := j
		for k < len(rs) && f(rs[k]) && (max <= 0 || k-j < max) {
			k++
		}
		return k - j
	}
	// Contractions: 's 't 're 've 'm 'll 'd.
	if at(i) == '\'' {
		lower := func(r rune) rune {
			if p.gpt2 {
				return r
			}
			return unicode.ToLower(r)
		}
		a, b := lower(at(i+1)), lower(at(i+2))
		switch {
		case a == 's' || a == 't' || a == 'm' || a == 'd':
			return 2
		case (a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'):
			return 3
		}
	}
	if p.gpt2 {
		sp := 0
		if at(i) == ' ' {
			sp = 1
		}
		if n := run(i+sp, isL, 0); n > 0 {
			return sp + n
		}
		if n := run(i+sp, isN, 0); n > 0 {
			return sp + n
		}
		if n := run(i+sp, isPunct, 0); n > 0 {
			return sp + n
		}
	} else {
		// [^\r\n\p{L}\p{N}]?\p{L}+
		if c := at(i); c >= 0 && !isCRLF(c) && !isL(c) && !isN(c) {
			if n := run(i+1, isL, 0); n > 0 {
				return 1 + n
			}
		}
		if n := run(i, isL, 0); n > 0 {
			return n
		}
		if n := run(i, isN, p.maxDigits); n > 0 {
			return n
		}
		// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
		sp := 0
		if at(i) == ' ' {
			sp = 1
		}
		if n := run(i+sp, isPunct, 0); n > 0 {
			return sp + n + run(i+sp+n, isCRLF, 0)
		}
		// \s*[\r\n]+: the whitespace run up to its last line break.
		ws := run(i, isS, 0)
		for k := ws - 1; k >= 0; k-- {
			if isCRLF(rs[i+k]) {
				return k + 1
			}
		}
	}
	// \s+(?!\S) then \s+
	if ws := run(i, isS, 0); ws > 0 {
		if i+ws == len(rs) || ws == 1 {
			return ws
		}
		return ws - 1
	}
	return 1
}
