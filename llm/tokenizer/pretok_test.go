package tokenizer

import (
	"errors"
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
		// runs are then cut off their space.
		{"default", []string{"Hello", ",", " world", "!", " ", "12345", " it", "'", "s", "\n\n ", " ok", "  "}},
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
		_, err := newRegexSplitter(f.regexes)
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

func TestHandSplittersMatchRegexes(t *testing.T) {
	for _, pre := range []string{"llama-bpe", "qwen2", "gpt2"} {
		hand, regex := mustSplitter(t, pre, false), mustSplitter(t, pre, true)
		for _, s := range splitCorpus {
			want := regex.split(s)
			if len(want) == 0 {
				want = nil
			}
			assert.Equal(t, want, hand.split(s), "%s %q", pre, s)
		}
	}
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
