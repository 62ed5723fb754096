package tokenizer

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

func mustSplitter(t testing.TB, pre string, regex bool) splitter {
	s, _, err := newPreTokenizer(pre, regex)
	require.NoError(t, err)
	return s
}

func TestPreTokenizers(t *testing.T) {
	text := "Hello, world! 12345 it's\n\n  ok  "
	cases := []struct {
		pre  string
		want []string
	}{
		{"llama-bpe", []string{"Hello", ",", " world", "!", " ", "123", "45", " it", "'s", "\n\n", " ", " ok", "  "}},
		{"qwen2", []string{"Hello", ",", " world", "!", " ", "1", "2", "3", "4", "5", " it", "'s", "\n\n", " ", " ok", "  "}},
		{"gpt2", []string{"Hello", ",", " world", "!", " 12345", " it", "'s", "\n\n ", " ok", "  "}},
		// llama.cpp's default: punctuation runs first, so the apostrophe is cut off "s"; digit
		// runs are then cut off their space, and into threes from the left.
		{"default", []string{"Hello", ",", " world", "!", " ", "123", "45", " it", "'", "s", "\n\n ", " ok", "  "}},
		{"starcoder", []string{"Hello", ",", " world", "!", " ", "1", "2", "3", "4", "5", " it", "'s", "\n\n ", " ok", "  "}},
		{"falcon", []string{"Hello", ",", " world", "!", " ", "123", "45", " it", "'", "s", "\n\n ", " ok", "  "}},
		{"deepseek-coder", []string{"Hello", ",", " world", "!", " ", "1", "2", "3", "4", "5", " it", "'", "s", "\n", "\n", " ", " ok", "  "}},
		{"bloom", []string{"Hello", ",", " world", "!", " 12345", " it's", "\n\n ", " ok", "  "}},
		{"superbpe", []string{"Hello, world! ", "12", "345", " it's\n\n  ok  "}},
	}
	for _, c := range cases {
		t.Run(c.pre, func(t *testing.T) {
			for _, regex := range []bool{false, true} {
				assert.Equal(t, c.want, mustSplitter(t, c.pre, regex).split(text), "regex=%v", regex)
			}
		})
	}
}

func TestUnknownPreTokenizer(t *testing.T) {
	_, err := New(bpeVocab("no-such-pre"))
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrUnknownPreTokenizer))
	assert.True(t, errors.Is(err, core.ErrUnsupported))
	assert.ErrorContains(t, err, `"no-such-pre"`)
	assert.ErrorContains(t, err, "llama-bpe", "the error lists what is supported")
}

func TestEveryFamilyCompiles(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range preFamilies {
		for _, n := range f.names {
			assert.False(t, seen[n], "%q is in two families", n)
			seen[n] = true
		}
		_, err := newRegexSplitter(f.regexes, false)
		assert.NoError(t, err, f.names[0])
	}
	for _, want := range []string{"llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon",
		"mpt", "starcoder", "refact", "gpt-2", "gpt-neox", "command-r", "smollm", "stablelm2", "olmo", "dbrx",
		"jais", "poro-chat", "chatglm-bpe", "viking", "tekken", "codeshell", "bloom", "exaone", "minerva-7b",
		"chameleon", "gpt-4o", "superbpe"} {
		assert.True(t, seen[want], want)
	}
}

// splitCorpus exercises each alternative of the patterns: contractions in both cases, digit
// runs, letters of several scripts with marks, punctuation before words, whitespace runs with
// and without line breaks, emoji and code.
var splitCorpus = []string{
	"", " ", "  ", "\n", " \n", "\n ", "\t\t\n\n x", "a  b   c    ", "x\r\n\r\ny",
	"it's IT'S we'Ll they'RE I'd 'tis '", "12345678 1,000,000.5 ٣٤٥ ⅷ 2²",
	"Hello, World!!! ...wait?!", "¿Qué pasó? Ça va. Über straße", "naïve café e\u0301",
	"日本語のテキスト、中文文本。한국어 텍스트", "Привет мир", "مرحبا بالعالم", "नमस्ते दुनिया",
	"😀👍🏽 🇫🇷 a😀b", "func main() {\n\tfmt.Println(\"hi\")\n}\n", "x := a[i+1] // c++ <b>&amp;</b>",
	"CamelCaseWord HTTPServer iPhone ABC def", "   leading and trailing   ", "a\u00a0b\u2009c\u3000d",
	"$100 ^_^ a|b ~x `code`", "<sentinel:12> IMGIMGABZ", "\x00\x01\x7f",
}

// splitterPair is a family's fast splitter (hand-written splitter or steps) and its published
// regexes, which must cut every text the same way.
type splitterPair struct {
	name        string
	fast, regex splitter
}

func splitterPairs(t testing.TB) []splitterPair {
	var out []splitterPair
	for _, f := range preFamilies {
		fast, regex := mustSplitter(t, f.names[0], false), mustSplitter(t, f.names[0], true)
		out = append(out, splitterPair{f.names[0], fast, regex})
	}
	return out
}

func TestHandSplittersMatchRegexes(t *testing.T) {
	extra := []string{"1234567", "12 345 6789 ١٢٣٤", "x1234y56", strings.Repeat("9", 100)}
	for _, p := range splitterPairs(t) {
		for _, s := range append(splitCorpus, extra...) {
			want := p.regex.split(s)
			if len(want) == 0 {
				want = nil
			}
			got := p.fast.split(s)
			if len(got) == 0 {
				got = nil
			}
			assert.Equal(t, want, got, "%s %q", p.name, s)
		}
	}
}

// FuzzPreTokenizers: every family's pieces cover the text exactly with no empty piece, the
// fast splitters agree with the published regexes, and byte-level BPE gives the text back.
func FuzzPreTokenizers(f *testing.F) {
	for _, s := range splitCorpus {
		f.Add(s)
	}
	f.Add("\xff\xfe 12345 \xc3")
	pairs := splitterPairs(f)
	bpe := fullBPE(f)
	var toks []*Tokenizer
	for _, p := range pairs {
		tk, err := bpe.withPre(p.name, false)
		if err != nil {
			f.Fatal(err)
		}
		toks = append(toks, tk)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 4096 {
			return // the regex engine is slow on long inputs; length is not what this explores
		}
		for i, p := range pairs {
			pieces := p.regex.split(s)
			if strings.Join(pieces, "") != s {
				t.Fatalf("%s: pieces %q do not cover %q", p.name, pieces, s)
			}
			for _, x := range pieces {
				if x == "" {
					t.Fatalf("%s: an empty piece in %q", p.name, pieces)
				}
			}
			fast := p.fast.split(s)
			if len(fast) != len(pieces) || (len(pieces) > 0 && !equalStrings(fast, pieces)) {
				t.Fatalf("%s: fast %q, regexes %q", p.name, fast, pieces)
			}
			if strings.Contains(s, "<|end|>") {
				continue // the control token decodes to nothing, by design
			}
			if got := toks[i].Decode(toks[i].Encode(s, false)); got != s {
				t.Fatalf("%s: %q -> %q", p.name, s, got)
			}
		}
	})
}

func equalStrings(a, b []string) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestRegexSplittersCoverTheText(t *testing.T) {
	for _, f := range preFamilies {
		s := mustSplitter(t, f.names[0], true)
		for _, text := range splitCorpus {
			pieces := s.split(text)
			assert.Equal(t, text, strings.Join(pieces, ""), "%s %q", f.names[0], text)
			for _, p := range pieces {
				assert.NotEmpty(t, p, "%s %q", f.names[0], text)
			}
		}
	}
}

// One tokenizer serves concurrent requests (the server's runners share the model): the regex
// splitters must be safe for that (run with -race).
func TestConcurrentEncode(t *testing.T) {
	tk, err := fullBPE(t).withPre("deepseek-v3", false)
	require.NoError(t, err)
	want := tk.Encode(strings.Join(splitCorpus, " "), false)
	done := make(chan []int32)
	for range 4 {
		go func() { done <- tk.Encode(strings.Join(splitCorpus, " "), false) }()
	}
	for range 4 {
		assert.Equal(t, want, <-done)
	}
}

func ExamplePreTokenizers() {
	names := PreTokenizers()
	fmt.Println(len(names) > 40, slices.Contains(names, "deepseek-coder"), slices.Contains(names, "falcon"))
	// Output: true true true
}
