package tokenizer

import (
	"strings"
	"testing"
)

// benchText is ~64 KiB of mixed text: English prose, code, numbers, and the reference strings
// (accents, CJK, emoji, whitespace runs).
func benchText() string {
	prose := "The quick brown fox jumps over the lazy dog. It's 12:45 and we've got 1,234 items " +
		"left; they'll ship by 2026-11-23. Don't panic!\n\n"
	code := "func main() {\n\tfor i := 0; i < 10; i++ {\n\t\tfmt.Println(i * 42)\n\t}\n}\n"
	var b strings.Builder
	for b.Len() < 64<<10 {
		b.WriteString(prose)
		b.WriteString(code)
		for _, s := range referenceTexts {
			b.WriteString(s)
			b.WriteByte(' ')
		}
	}
	return b.String()
}

// BenchmarkPreTokenize compares the hand-written steps with the published regexes on regexp2
// (MB/s of input): "hand" runs a family as Encode does (hand-written steps where a pattern has
// one), "regexp2" every pattern on regexp2. Families with no hand-written step run regexp2 only.
func BenchmarkPreTokenize(b *testing.B) {
	text := benchText()
	for _, c := range []struct {
		pre   string
		regex bool
	}{
		{"llama-bpe", false}, {"llama-bpe", true},
		{"qwen2", false}, {"qwen2", true},
		{"gpt-2", false}, {"gpt-2", true},
		{"starcoder", false}, {"starcoder", true}, {"falcon", false}, {"falcon", true},
		{"deepseek-v3", true}, {"deepseek-llm", true}, {"gpt-4o", true},
	} {
		name := c.pre + "/hand"
		if c.regex {
			name = c.pre + "/regexp2"
		}
		b.Run(name, func(b *testing.B) {
			s := mustSplitter(b, c.pre, c.regex)
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				s.split(text)
			}
		})
	}
}

// BenchmarkEncodeBPE is a whole encode (specials, pre-tokenizer, merges) on a small byte-level
// vocabulary, to show the pre-tokenizer's share.
func BenchmarkEncodeBPE(b *testing.B) {
	text := benchText()
	for _, regex := range []bool{false, true} {
		name := "llama-bpe/hand"
		if regex {
			name = "llama-bpe/regexp2"
		}
		b.Run(name, func(b *testing.B) {
			tk, err := fullBPE(b).withPre("llama-bpe", regex)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tk.Encode(text, false)
			}
		})
	}
}
