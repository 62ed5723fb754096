package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// WordPiece (BERT, tokenizer.ggml.model "bert"), as llama.cpp runs it for embedding models. The
// GGUF converter rewrites BERT's vocabulary for a phantom-space scheme: a word-initial piece
// "hello" is stored as "▁hello" and a continuation "##lo" as "lo", so a word is matched as "▁"
// followed by the word, longest piece first.

// wpmSplit is llama.cpp's WordPiece pre-processing: every character reduced to the first
// character of its canonical decomposition (llama.cpp's table keeps one code point per code
// point, so "é" becomes "e" and a Hangul syllable its leading consonant), lowercased; whitespace
// ends a word; NUL, U+FFFD and control and format characters are dropped; punctuation, ASCII
// symbols and CJK ideographs are words of one character.
func wpmSplit(text string) []string {
	var words []string
	var cur strings.Builder
	flush := func() {
		if cur.Len() > 0 {
			words = append(words, cur.String())
			cur.Reset()
		}
	}
	for _, r := range text {
		r = nfdFirst(r)
		switch {
		case unicode.IsSpace(r):
			flush()
			continue
		case r == 0 || r == utf8.RuneError || unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs):
			continue
		}
		lower := unicode.ToLower(r)
		if unicode.IsPunct(r) || (r < 0x7f && unicode.IsSymbol(r)) || isCJKIdeograph(r) {
			flush()
			words = append(words, string(lower))
			continue
		}
		cur.WriteRune(lower)
	}
	flush()
	return words
}

// nfdFirst is the first code point of r's canonical decomposition (r itself when it has none).
func nfdFirst(r rune) rune {
	var buf [utf8.UTFMax]byte
	n := utf8.EncodeRune(buf[:], r)
	if norm.NFD.IsNormal(buf[:n]) {
		return r
	}
	d, _ := utf8.DecodeRune(norm.NFD.Bytes(buf[:n]))
	return d
}

// isCJKIdeograph is BERT's "Chinese character" test (the CJK Unified Ideographs blocks and
// their extensions, and the compatibility ideographs), with the extension range as the
// Hugging Face code and llama.cpp write it (0x2B920, not 0x2B820).
func isCJKIdeograph(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) ||
		(r >= 0x20000 && r <= 0x2A6DF) || (r >= 0x2A700 && r <= 0x2B73F) ||
		(r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B920 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}

// encodeWPM appends the WordPiece ids of text: each word, with the phantom space before it, is
// covered greedily by the longest vocabulary pieces from the left (byte offsets, as llama.cpp
// matches them); a word that cannot be covered whole is one UNK.
func (t *Tokenizer) encodeWPM(out []int32, text string) []int32 {
	for _, word := range wpmSplit(text) {
		w := spmSpace + word
		start := len(out)
		for i := 0; i < len(w); {
			j := min(len(w), i+t.maxTokenLen)
			for ; j > i; j-- {
				if id, ok := t.index[w[i:j]]; ok {
					out = append(out, id)
					break
				}
			}
			if j == i {
				out = out[:start]
				break
			}
			i = j
		}
		if len(out) == start && t.v.UNK >= 0 {
			out = append(out, t.v.UNK)
		}
	}
	return out
}
